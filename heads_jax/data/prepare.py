"""``prepare_corpus``: English Wikipedia and folders of books, converted once into the corpus the
pre-training stream reads (``heads_jax.data.corpora.PreparedCorpus``).

Inputs:

* Wikipedia as Parquet files with ``id`` and ``text`` columns (``title`` optional): the
  Hugging Face data set ``wikimedia/wikipedia`` (e.g. its ``20231101.en`` folder, 41 files,
  6.4M articles), fetched with ``hf download`` or any copy of it. Read with
  pyarrow, so neither TensorFlow nor an Apache Beam build of TFDS ``wikipedia`` is needed. One
  article is one document; its paragraphs are its non-empty lines.
* Text files (``paragraphs`` layout: a book per file, blank lines between paragraphs, wrapped
  lines; or ``lines``: one paragraph per line, blank lines between documents), e.g. the
  Gutenberg subset. A book is cut at blank lines into parts of about ``part_bytes`` (one
  document each, one group per book, so the parts of a book are never each other's random next
  segment), its wrapped lines joined.

Output (a local directory or a ``gs://`` URL)::

    corpus.json                 manifest: format, inputs, held-out fraction, per side the shard
                                files and document / byte counts
    train-UNIT.txt, eval-UNIT.txt  the documents, one paragraph per line, a blank line after each
    index-train.npz, index-eval.npz  per document: shard int32, start / end byte int64, group int64
    parts/UNIT.npz, parts/UNIT.json  the index of one input unit, and its "done" marker

An input unit is one Parquet file or one text input. A document is held out for evaluation by
``heldout_unit`` of its key (``wikipedia:ID``, ``text:FILE:PART``), so held-out articles and book
parts are never in a training shard. Units are written one by one and marked done; running the
same command again skips the units already done (resumable) and rebuilds the index from the
parts. A progress bar counts documents.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from heads_jax import storage
from heads_jax.data.corpora import (MANIFEST, PART_BYTES, _expand_paths, _unit_hash, heldout_unit,
                                    index_name)
from heads_jax.data.utf8 import check_utf8
from heads_jax.errors import UserError

FORMAT = "heads_jax.corpus/1"
DEFAULT_HELDOUT = 0.005


def _parquet_files(patterns: Sequence[str]) -> list[str]:
  out = []
  for p in patterns:
    p = str(p)
    if storage.is_url(p):
      root = storage.as_path(p)
      if root.is_dir():
        out += sorted(os.fspath(f) for _, f in storage.walk_files(root) if f.name.endswith(".parquet"))
      else:
        out.append(p)
    elif os.path.isdir(p):
      out += sorted(glob.glob(os.path.join(p, "**", "*.parquet"), recursive=True))
    elif any(c in p for c in "*?["):
      out += sorted(glob.glob(p, recursive=True))
    elif os.path.isfile(p):
      out.append(p)
    else:
      raise FileNotFoundError(f"Wikipedia input {p} does not exist: pass Parquet files, a folder "
                              f"of them or a glob")
  if patterns and not out:
    raise FileNotFoundError(f"no Parquet files in {list(patterns)}")
  return out


def _unit_id(kind: str, path: str) -> str:
  stem = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(path.rstrip("/")).rsplit(".", 1)[0])
  return f"{kind}-{stem[:40]}-{int(_unit_hash(path) * 16 ** 8):08x}"


def _clean_lines(text: str) -> list[str]:
  return [" ".join(line.split()) for line in text.split("\n") if line.strip()]


class _ShardWriter:
  """Writes the documents of one unit to its train and eval shards, recording byte offsets."""

  def __init__(self, out, unit: str):
    self.names = {side: f"{side}-{unit}.txt" for side in ("train", "eval")}
    self.files = {side: (out / name).open("wb") for side, name in self.names.items()}
    self.pos = {"train": 0, "eval": 0}
    self.rows = {"train": [], "eval": []}

  def add(self, side: str, paragraphs: list[str], group: int) -> None:
    data = ("\n".join(paragraphs) + "\n\n").encode("utf-8")
    start = self.pos[side]
    self.files[side].write(data)
    self.pos[side] += len(data)
    self.rows[side].append((start, start + len(data) - 1, group))  # the blank line excluded

  def close(self) -> None:
    for f in self.files.values():
      f.close()


def _wikipedia_unit(path: str, writer: _ShardWriter, fraction: float, text_key: str, bar) -> None:
  import pyarrow.parquet as pq  # only to read Wikipedia Parquet files
  with storage.as_path(path).open("rb") as fh:
    pf = pq.ParquetFile(fh)
    columns = [c for c in ("id", text_key) if c in pf.schema_arrow.names]
    if text_key not in columns or "id" not in columns:
      raise UserError(f"{path}: Wikipedia Parquet files need 'id' and '{text_key}' columns; it "
                      f"has {pf.schema_arrow.names}")
    group = 0
    for batch in pf.iter_batches(columns=columns, batch_size=512):
      ids, texts = batch.column("id").to_pylist(), batch.column(text_key).to_pylist()
      held = heldout_unit([f"wikipedia:{i}" for i in ids], fraction, at_least_one=False)
      for h, text in zip(held, texts):
        paragraphs = _clean_lines(text or "")
        if paragraphs:
          writer.add("eval" if h else "train", paragraphs, group)
          group += 1
      bar.update(len(ids))


def _book_parts(path: str, layout: str, part_bytes: int) -> list[list[str]]:
  """The documents of a text file as lists of paragraphs (one line each)."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if layout == "lines":
    return [p for p in (_clean_lines(d) for d in re.split(r"\n\s*\n", text)) if p]
  paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
  parts, cur, size = [], [], 0
  for p in paragraphs:
    cur.append(p)
    size += len(p.encode("utf-8")) + 1
    if size >= part_bytes:
      parts.append(cur)
      cur, size = [], 0
  if cur:
    parts.append(cur)
  return parts


def _text_unit(paths: list[str], layout: str, writer: _ShardWriter, fraction: float,
               part_bytes: int, bar) -> None:
  docs, keys, groups = [], [], []
  for g, path in enumerate(paths):
    check_utf8(path)
    for i, paragraphs in enumerate(_book_parts(path, layout, part_bytes)):
      docs.append(paragraphs)
      keys.append(f"text:{os.path.basename(path)}:{i}")
      groups.append(g if layout == "paragraphs" else len(groups))
  held = heldout_unit(keys, fraction)
  for h, paragraphs, g in zip(held, docs, groups):
    writer.add("eval" if h else "train", paragraphs, g)
  bar.update(len(paths))


def prepare_corpus(out, *, wikipedia: Sequence[str] = (), text: Sequence[str] = (),
                   text_layout: str = "paragraphs", heldout_fraction: float = DEFAULT_HELDOUT,
                   part_bytes: int = PART_BYTES, text_key: str = "text", progress: bool = True,
                   log: Callable[[str], None] = print) -> dict:
  """Converts the inputs (module docstring) into a prepared corpus in ``out``; returns its
  manifest. Units already done in ``out`` (an earlier, interrupted run) are skipped; a run with
  other settings than the corpus already there is refused."""
  if not wikipedia and not text:
    raise UserError("nothing to prepare: pass --wikipedia PARQUET... and/or --text PATH...")
  if not 0 <= heldout_fraction < 1:
    raise UserError(f"--heldout-fraction must be in [0, 1); got {heldout_fraction}")
  if text_layout not in ("paragraphs", "lines"):
    raise UserError(f"--text-layout must be paragraphs or lines; got {text_layout!r}")
  root = storage.as_path(out)
  (root / "parts").mkdir(parents=True, exist_ok=True)
  settings = {"heldout_fraction": heldout_fraction, "part_bytes": part_bytes,
              "text_layout": text_layout, "text_key": text_key}
  units = [(_unit_id("wiki", p), "wikipedia", [p]) for p in _parquet_files(wikipedia)]
  for t in text:
    files = _expand_paths([t])
    if not files:
      raise FileNotFoundError(f"no text files in {t}")
    units.append((_unit_id("text", str(t)), "text", files))
  todo = [u for u in units if not (root / "parts" / f"{u[0]}.json").exists()]
  for unit, _, _ in units:
    marker = root / "parts" / f"{unit}.json"
    if marker.exists() and json.loads(marker.read_text())["settings"] != settings:
      raise UserError(f"{storage.display(root)} holds a corpus prepared with other settings "
                      f"({json.loads(marker.read_text())['settings']}); use another --out")
  if len(todo) < len(units):
    log(f"{len(units) - len(todo)} of {len(units)} inputs already prepared in "
        f"{storage.display(root)}; resuming")
  total = 0
  for _, kind, paths in todo:
    if kind == "wikipedia":
      import pyarrow.parquet as pq  # only to count the rows of Wikipedia Parquet files
      with storage.as_path(paths[0]).open("rb") as fh:
        total += pq.ParquetFile(fh).metadata.num_rows
    else:
      total += len(paths)
  with tqdm(total=total, unit="doc", desc="prepare corpus", disable=not progress,
            dynamic_ncols=True) as bar:
    for unit, kind, paths in todo:
      writer = _ShardWriter(root, unit)
      try:
        if kind == "wikipedia":
          _wikipedia_unit(paths[0], writer, heldout_fraction, text_key, bar)
        else:
          _text_unit(paths, text_layout, writer, heldout_fraction, part_bytes, bar)
      finally:
        writer.close()
      arrays = {}
      for side in ("train", "eval"):
        rows = np.asarray(writer.rows[side], np.int64).reshape(-1, 3)
        arrays[f"{side}_start"], arrays[f"{side}_end"], arrays[f"{side}_group"] = rows.T
      with (root / "parts" / f"{unit}.npz").open("wb") as f:
        np.savez(f, **arrays)
      (root / "parts" / f"{unit}.json").write_text(json.dumps(
          {"unit": unit, "kind": kind, "inputs": [storage.display(p) for p in paths],
           "shards": writer.names, "bytes": writer.pos, "settings": settings}))
  return _write_index(root, [u[0] for u in units], settings)


def _write_index(root, units: list[str], settings: dict) -> dict:
  """Merges the units' parts into ``index-{train,eval}.npz`` and writes ``corpus.json``."""
  manifest = {"format": FORMAT, **settings, "units": [], "splits": {}}
  sides = {"train": ([], [], [], [], []), "eval": ([], [], [], [], [])}
  group_offset = 0
  for unit in units:
    meta = json.loads((root / "parts" / f"{unit}.json").read_text())
    manifest["units"].append({k: meta[k] for k in ("unit", "kind", "inputs")})
    with (root / "parts" / f"{unit}.npz").open("rb") as f:
      with np.load(f) as z:
        arrays = {k: z[k] for k in z.files}
    top = 0
    for side, (shards, shard, start, end, group) in sides.items():
      n = len(arrays[f"{side}_start"])
      if n:
        shard.append(np.full(n, len(shards), np.int32))
        shards.append(meta["shards"][side])
        start.append(arrays[f"{side}_start"])
        end.append(arrays[f"{side}_end"])
        group.append(arrays[f"{side}_group"] + group_offset)
        top = max(top, int(arrays[f"{side}_group"].max()) + 1)
    group_offset += top
  for side, (shards, shard, start, end, group) in sides.items():
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    idx = {"shard": cat(shard, np.int32), "start": cat(start, np.int64),
           "end": cat(end, np.int64), "group": cat(group, np.int64)}
    with (root / index_name(side)).open("wb") as f:
      np.savez(f, **idx)
    manifest["splits"][side] = {"shards": shards, "documents": int(len(idx["start"])),
                                "bytes": int((idx["end"] - idx["start"]).sum())}
  (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
  return manifest
