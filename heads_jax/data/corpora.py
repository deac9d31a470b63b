"""Pre-training corpora: random access to the documents of text files or TFDS data sets.

* ``TextCorpus(paths, layout="paragraphs")``: plain UTF-8 files where each file is one
  document (a book) and paragraphs are separated by blank lines with wrapped lines inside
  (the layout of ``../shared/data/corpus/gutenberg``);
* ``TextCorpus(paths, layout="lines")``: the BERT recipe's input layout: one sentence or
  paragraph per line, blank lines between documents (Wikipedia dumps prepared for BERT);
* ``TfdsCorpus(name, split)``: any TFDS text data set with a string feature (``wikipedia``'s
  ``text``), read by random access through ``tfds.data_source``;
* ``PreparedCorpus(directory, use)``: what ``heads-jax prepare-corpus`` wrote (English
  Wikipedia + a folder of books, ``heads_jax.data.prepare``): text shards and a byte-offset
  index per side of the held-out split, loaded without a scan;
* ``MixtureCorpus([...], weights)``: several of them (Wikipedia + Gutenberg as in the paper),
  a corpus drawn by weight (default: proportional to size) for every document draw;
  ``make_corpus("tfds:wikipedia/20230601.en;path/to/gutenberg")`` builds it.

Every corpus has the methods ``PretrainingExamples`` uses: ``len``, ``sample_document(rng)``
(a document id, drawn with probability about proportional to its length), ``length(doc)``,
``read(doc, start, stop) -> (text, reaches_end)``, ``paragraphs_of(doc, text)``,
``group(doc)`` (documents of one group never serve as each other's random next segment) and
``estimated_chars()``.

Held-out evaluation text: every corpus can be cut into a ``"train"`` and an ``"eval"`` side that
share no document (``heldout_unit``: by a hash of each document's key, so every host and every
run agrees). The pre-training job trains on the train side and evaluates on the eval side.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from heads_jax import storage
from heads_jax.data.utf8 import check_utf8
from heads_jax.errors import UserError


PART_BYTES = 64 * 1024  # documents of the paragraphs layout are cut at blank lines into parts this long
USES = ("all", "train", "eval")


def heldout_unit(keys, fraction: float, *, at_least_one: bool = True) -> np.ndarray:
  """Which of the documents named ``keys`` are held out for evaluation: bool ``[n]``.

  A document is held out when the hash of its key (64-bit BLAKE2b, as a number in [0, 1)) is
  below ``fraction``, so the choice depends on the key only (not on the order of the files or on
  the other documents) and is the same on every host and every run. With ``at_least_one`` and
  ``fraction > 0`` the document of the smallest hash is held out when none falls below (a small
  corpus still gets an evaluation set), unless there is only one document."""
  u = np.asarray([_unit_hash(k) for k in keys], np.float64)
  held = u < fraction
  if at_least_one and fraction > 0 and len(u) > 1 and not held.any():
    held[np.argmin(u)] = True
  return held


def _unit_hash(key: str) -> float:
  digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0 ** 64


class IndexedTextCorpus:
  """Documents given by byte ranges of UTF-8 text files, read by ``os.pread`` (nothing is held
  in memory but the index): ``file``, ``start``, ``end`` and ``group`` (int ``[n]``) per
  document, ``layout`` how its paragraphs are separated (``paragraphs``: blank lines, wrapped
  lines inside; ``lines``: one paragraph per line)."""

  def __init__(self, paths, file, start, end, group, layout: str):
    self.paths = [str(p) for p in paths]
    self.layout = layout
    self.file = np.asarray(file, np.int32)
    self.start = np.asarray(start, np.int64)
    self.end = np.asarray(end, np.int64)
    self.groups = np.asarray(group, np.int64)
    if not len(self.file):
      raise ValueError(f"the text files {self.paths[:3]}... hold no document")
    self._cum = np.cumsum(self.end - self.start)
    self._fds: dict[int, int] = {}

  def __getstate__(self):  # file descriptors are opened again in a new process
    state = dict(self.__dict__)
    state["_fds"] = {}
    return state

  def __len__(self) -> int:
    return len(self.file)

  def group(self, doc: int) -> int:
    """Documents of the same group never serve as each other's random next segment."""
    return int(self.groups[doc])

  def length(self, doc: int) -> int:
    return int(self.end[doc] - self.start[doc])

  def sample_document(self, rng: np.random.Generator) -> int:
    """A document drawn with probability proportional to its length in bytes."""
    x = rng.integers(0, int(self._cum[-1]))
    return int(np.searchsorted(self._cum, x, side="right"))

  def estimated_chars(self) -> float:
    return float(self._cum[-1])

  def read(self, doc: int, start: int, stop: int) -> tuple[str, bool]:
    """Text of bytes ``[start, stop)`` of ``doc`` (clipped) and whether it reaches the end."""
    f = int(self.file[doc])
    fd = self._fds.get(f)
    if fd is None:
      fd = self._fds[f] = os.open(self.paths[f], os.O_RDONLY)
    begin = int(self.start[doc]) + start
    finish = min(int(self.end[doc]), int(self.start[doc]) + stop)
    data = os.pread(fd, max(0, finish - begin), begin)
    # The file is valid UTF-8 (checked by the index); "ignore" drops only the pieces of a
    # multi-byte character that a random byte range cuts at either end.
    return data.decode("utf-8", errors="ignore"), finish >= int(self.end[doc])

  def paragraphs_of(self, doc: int, text: str) -> list[str]:
    return self.paragraphs(text)

  def paragraphs(self, text: str) -> list[str]:
    if self.layout == "lines":
      return [line for line in text.split("\n") if line.strip()]
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


class TextCorpus(IndexedTextCorpus):
  """Documents of plain UTF-8 text files, read by byte range (nothing is held in memory).

  Args:
    paths: files, directories (every ``*.txt`` inside, sorted) or glob patterns; cloud URLs
      (``gs://...``) are mirrored into the local cache first (``heads_jax.storage``).
    layout: ``"paragraphs"`` (one document per file, blank lines between paragraphs, wrapped
      lines) or ``"lines"`` (one paragraph or sentence per line, blank lines between documents).
    use: ``"all"`` documents, or the ``"train"`` / ``"eval"`` side of the held-out split: a
      document (for the ``paragraphs`` layout: a part of about ``part_bytes`` of a file, cut at a
      blank line) is held out for evaluation by ``heldout_unit`` of its key (file name and
      part number), with ``heldout_fraction``; the two sides never share a byte.
    part_bytes: cut ``paragraphs`` files into parts of at least this many bytes (default: whole
      files when ``use`` is ``"all"``, ``PART_BYTES`` otherwise). Parts of one file form one
      group (never each other's random next segment).

  The index is one ``(file, start byte, end byte)`` row per document; every file is scanned
  once (it must be UTF-8: a ``UserError`` names the file and line otherwise), and once more
  to find blank lines where the layout or the parts need them. For a large corpus, prepare the
  index once with ``heads-jax prepare-corpus`` (``PreparedCorpus``).
  """

  def __init__(self, paths, layout: str = "paragraphs", *, use: str = "all",
               heldout_fraction: float = 0.0, part_bytes: int | None = None):
    if layout not in ("paragraphs", "lines"):
      raise ValueError(f"layout must be 'paragraphs' or 'lines', got {layout!r}")
    if use not in USES:
      raise ValueError(f"use must be one of {USES}, got {use!r}")
    if part_bytes is None and use != "all" and layout == "paragraphs":
      part_bytes = PART_BYTES
    found = _expand_paths(paths)
    if not found:
      raise FileNotFoundError(f"no text files found in {paths!r}; pass files, directories of "
                              f"*.txt files or glob patterns")
    files, starts, ends, groups, keys = [], [], [], [], []
    for f, path in enumerate(found):
      check_utf8(path)
      name = os.path.basename(path)
      if layout == "lines":
        spans = _blank_line_spans(path)
      elif part_bytes:
        spans = _part_spans(path, part_bytes)
      else:
        spans = [(0, os.path.getsize(path))]
      for i, (s, e) in enumerate(spans):
        if e > s:
          files.append(f)
          starts.append(s)
          ends.append(e)
          groups.append(f if layout == "paragraphs" else len(groups))
          keys.append(f"text:{name}:{i}")
    if not files:
      raise ValueError(f"the text files {found[:3]}... are empty")
    keep = np.ones(len(files), bool)
    if use != "all":
      held = heldout_unit(keys, heldout_fraction)
      keep = held if use == "eval" else ~held
      if not keep.any():
        raise UserError(f"no {use} documents in {found[:3]}... (held-out fraction "
                        f"{heldout_fraction}): use more text or another fraction")
    idx = np.flatnonzero(keep)
    super().__init__(found, np.asarray(files)[idx], np.asarray(starts)[idx],
                     np.asarray(ends)[idx], np.asarray(groups)[idx], layout)
    self.use = use


class PreparedCorpus(IndexedTextCorpus):
  """The corpus ``heads-jax prepare-corpus`` wrote into ``directory`` (``heads_jax.data.prepare``):
  text shards in the ``lines`` layout and a byte-offset index per side of the held-out split,
  loaded at once (no scan). ``use``: ``"train"`` or ``"eval"`` (the held-out documents, never in
  a training shard) or ``"all"``. A cloud URL is mirrored into the local cache first (once per
  host; files already there are kept)."""

  def __init__(self, directory, use: str = "train"):
    if use not in USES:
      raise ValueError(f"use must be one of {USES}, got {use!r}")
    local = storage.local_copy(directory) if storage.is_url(directory) else directory
    self.manifest = read_prepared_manifest(local)
    sides = ("train", "eval") if use == "all" else (use,)
    paths, file, start, end, group = [], [], [], [], []
    for side in sides:
      with np.load(os.path.join(local, index_name(side))) as z:
        offset = len(paths)
        paths += [os.path.join(local, s) for s in self.manifest["splits"][side]["shards"]]
        file.append(z["shard"] + offset)
        start.append(z["start"])
        end.append(z["end"])
        group.append(z["group"])
    if not sum(len(f) for f in file):
      raise UserError(f"the prepared corpus {directory} has no {use} documents")
    super().__init__(paths, np.concatenate(file), np.concatenate(start), np.concatenate(end),
                     np.concatenate(group), "lines")
    self.use = use
    self.directory = str(directory)


MANIFEST = "corpus.json"


def index_name(side: str) -> str:
  return f"index-{side}.npz"


def read_prepared_manifest(directory) -> dict:
  """The ``corpus.json`` of a prepared corpus (local directory)."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{directory} is not a prepared corpus (no {MANIFEST}); run "
                            f"`heads-jax prepare-corpus --out {directory} ...` first")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def is_prepared_corpus(path) -> bool:
  """Whether ``path`` (a local directory or a URL) holds a prepared corpus."""
  try:
    return (storage.as_path(path) / MANIFEST).exists()
  except (OSError, ValueError):
    return False


class TfdsCorpus:
  """Documents of a TFDS text data set, by random access (``tfds.data_source``).

  Args:
    name: e.g. ``"wikipedia/20230601.en"``; the data set must be prepared in ``data_dir``
      (array_record format), since nothing downloads here.
    split: e.g. ``"train"`` or ``"train[:90%]"``.
    text_key: the string feature holding the document.
    accept_chars: documents are drawn uniformly and accepted with probability
      ``min(1, len(text) / accept_chars)``, i.e. with probability proportional to
      ``min(length, accept_chars)`` (proportional to length, as for text files, for documents
      up to ``accept_chars`` characters; longer ones are capped). No length index is built.

  Paragraphs are the non-empty lines of a document.
  """

  def __init__(self, name: str, split: str = "train", *, data_dir=None, text_key: str = "text",
               accept_chars: int = 4000, source=None, use: str = "all",
               heldout_fraction: float = 0.0):
    if use not in USES:
      raise ValueError(f"use must be one of {USES}, got {use!r}")
    self.name, self.split, self.data_dir, self.text_key = name, split, data_dir, text_key
    self.accept_chars = accept_chars
    self.use, self.heldout_fraction = use, float(heldout_fraction)
    self._source = source
    if source is None:
      self._source = _tfds_source(name, split, data_dir)
    if len(self._source) == 0:
      raise ValueError(f"TFDS {name} split {split} has no documents")
    self._text = functools.lru_cache(maxsize=256)(self._read_text)

  def __getstate__(self):
    state = dict(self.__dict__)
    state.pop("_text")
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._text = functools.lru_cache(maxsize=256)(self._read_text)

  def _read_text(self, doc: int) -> str:
    value = self._source[int(doc)][self.text_key]
    if isinstance(value, bytes):
      value = value.decode("utf-8", errors="ignore")
    return str(value)

  def __len__(self) -> int:
    return len(self._source)

  def group(self, doc: int) -> int:
    return int(doc)

  def length(self, doc: int) -> int:
    return len(self._text(doc))

  def on_side(self, doc: int) -> bool:
    """Whether document ``doc`` belongs to this corpus's ``use`` (``heldout_unit``'s rule on the
    key ``tfds:NAME:INDEX``, decided per document as it is drawn)."""
    if self.use == "all":
      return True
    held = _unit_hash(f"tfds:{self.name}:{int(doc)}") < self.heldout_fraction
    return held == (self.use == "eval")

  def sample_document(self, rng: np.random.Generator) -> int:
    tries = 0
    for _ in range(1_000_000):
      doc = int(rng.integers(0, len(self)))
      if not self.on_side(doc):
        continue
      tries += 1
      if rng.random() * self.accept_chars < self.length(doc) or tries >= 100:
        return doc
    raise UserError(f"TFDS {self.name}: no {self.use} document found (held-out fraction "
                    f"{self.heldout_fraction})")

  def estimated_chars(self, sample: int = 200) -> float:
    """Number of documents x the mean length of up to ``sample`` documents (fixed seed)."""
    rng = np.random.default_rng(0)
    docs = rng.choice(len(self), size=min(sample, len(self)), replace=False)
    return float(len(self) * np.mean([len(self._read_text(int(d))) for d in docs]))

  def read(self, doc: int, start: int, stop: int) -> tuple[str, bool]:
    text = self._text(doc)
    return text[start:stop], stop >= len(text)

  def paragraphs_of(self, doc: int, text: str) -> list[str]:
    return self.paragraphs(text)

  def paragraphs(self, text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def _tfds_source(name: str, split: str, data_dir):
  import tensorflow_datasets as tfds  # optional heavy dependency, only for tfds: sources
  builder = name.split("/")[0].split(":")[0]
  for module in ("text", "text.wikipedia"):  # TFDS registers some text builders lazily
    try:
      tfds.builder_cls(builder)
      break
    except Exception:
      try:
        __import__(f"tensorflow_datasets.{module}.{builder}")
      except ImportError:
        pass
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir)
  except Exception as e:
    raise UserError(f"could not open TFDS data set {name!r} split {split!r} in data_dir "
                       f"{data_dir!r}: {e}. Prepare it first (tfds build with "
                       f"file_format=array_record) or use plain text files") from e


def _expand_paths(paths) -> list[str]:
  if isinstance(paths, (str, Path)):
    paths = [paths]
  out = []
  for p in paths:
    p = str(p)
    if storage.is_url(p):
      p = str(storage.local_copy(p))  # a bucket's text files, mirrored once into the local cache
    if os.path.isdir(p):
      out.extend(sorted(glob.glob(os.path.join(p, "*.txt"))))
    elif any(c in p for c in "*?["):
      out.extend(sorted(glob.glob(p)))
    elif os.path.isfile(p):
      out.append(p)
    else:
      raise FileNotFoundError(f"pre-training text {p} does not exist")
  return out


def _blank_line_spans(path: str) -> list[tuple[int, int]]:
  """Byte spans of the documents of a ``lines`` file (blank lines separate documents)."""
  spans, start, pos = [], None, 0
  with open(path, "rb") as f:
    for line in f:
      if line.strip():
        if start is None:
          start = pos
      elif start is not None:
        spans.append((start, pos))
        start = None
      pos += len(line)
  if start is not None:
    spans.append((start, pos))
  return spans


def _part_spans(path: str, part_bytes: int) -> list[tuple[int, int]]:
  """Byte spans covering a ``paragraphs`` file, each at least ``part_bytes`` long (the last may
  be shorter) and ending after a blank line."""
  spans, start, pos = [], 0, 0
  with open(path, "rb") as f:
    for line in f:
      pos += len(line)
      if not line.strip() and pos - start >= part_bytes:
        spans.append((start, pos))
        start = pos
  if pos > start:
    spans.append((start, pos))
  return spans


class MixtureCorpus:
  """Several corpora as one: a document is drawn from corpus ``c`` with probability
  ``weights[c]`` (default: proportional to each corpus's ``estimated_chars``), then within it.
  Document ids are offset per corpus; groups never collide across corpora."""

  def __init__(self, corpora: Sequence, weights: Sequence[float] | None = None):
    if not corpora:
      raise ValueError("MixtureCorpus needs at least one corpus")
    self.corpora = list(corpora)
    if weights is None:
      weights = [c.estimated_chars() for c in self.corpora]
    w = np.asarray(weights, np.float64)
    if len(w) != len(self.corpora) or np.any(w < 0) or w.sum() <= 0:
      raise ValueError(f"mixture weights {list(weights)} must be one non-negative number per "
                       f"corpus ({len(self.corpora)}), not all zero")
    self.weights = w / w.sum()
    self._offsets = np.cumsum([0] + [len(c) for c in self.corpora])

  def __len__(self) -> int:
    return int(self._offsets[-1])

  def _locate(self, doc: int) -> tuple[int, int]:
    c = int(np.searchsorted(self._offsets, doc, side="right") - 1)
    return c, int(doc - self._offsets[c])

  def group(self, doc: int) -> int:
    c, d = self._locate(doc)
    return int(self._offsets[c]) + self.corpora[c].group(d)

  def length(self, doc: int) -> int:
    c, d = self._locate(doc)
    return self.corpora[c].length(d)

  def sample_document(self, rng: np.random.Generator) -> int:
    c = int(rng.choice(len(self.corpora), p=self.weights))
    return int(self._offsets[c]) + self.corpora[c].sample_document(rng)

  def read(self, doc: int, start: int, stop: int):
    c, d = self._locate(doc)
    return self.corpora[c].read(d, start, stop)

  def paragraphs_of(self, doc: int, text: str) -> list[str]:
    c, _ = self._locate(doc)
    return self.corpora[c].paragraphs(text)

  def estimated_chars(self) -> float:
    return float(sum(c.estimated_chars() for c in self.corpora))


def make_corpus(sources, *, layout: str = "paragraphs", split: str = "train", data_dir=None,
                text_key: str = "text", weights: Sequence[float] | None = None,
                side: str = "all", heldout_fraction: float = 0.0):
  """A corpus from source strings separated by ``;`` (or a list of them); each is a prepared
  corpus directory (``heads-jax prepare-corpus``; local or ``gs://``), ``tfds:NAME`` (e.g.
  ``tfds:wikipedia/20230601.en``) or text paths separated by commas (files, directories of
  ``*.txt``, glob patterns, URLs). Several sources make a ``MixtureCorpus``.

  ``side``: ``"train"`` or ``"eval"`` selects that side of the held-out split (``"all"``: every
  document). A prepared corpus has its split built in; text and TFDS sources are split here with
  ``heldout_fraction`` (0: not split, every document on both sides)."""
  if isinstance(sources, str):
    sources = [s.strip() for s in sources.split(";") if s.strip()]
  if not sources:
    raise ValueError("no pre-training data source given: set data.sources to text paths or "
                     "tfds:NAME")
  if side not in USES:
    raise ValueError(f"side must be one of {USES}, got {side!r}")
  plain = side if heldout_fraction > 0 else "all"
  corpora = []
  for source in sources:
    if source.startswith("tfds:"):
      corpora.append(TfdsCorpus(source[len("tfds:"):], split, data_dir=data_dir or None,
                                text_key=text_key, use=plain, heldout_fraction=heldout_fraction))
    elif "," not in source and is_prepared_corpus(source):
      corpora.append(PreparedCorpus(source, use=side))
    else:
      corpora.append(TextCorpus([p for p in source.split(",") if p], layout=layout, use=plain,
                                heldout_fraction=heldout_fraction))
  if len(corpora) == 1:
    return corpora[0]
  return MixtureCorpus(corpora, weights)
