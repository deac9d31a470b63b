"""Pre-training corpora: random access to the documents of text files or TFDS data sets.

* ``TextCorpus(paths, layout="paragraphs")``: plain UTF-8 files where each file is one
  document (a book) and paragraphs are separated by blank lines with wrapped lines inside
  (the layout of ``/work/shared/data/corpus/gutenberg``);
* ``TextCorpus(paths, layout="lines")``: the BERT recipe's input layout: one sentence or
  paragraph per line, blank lines between documents (Wikipedia dumps prepared for BERT);
* ``TfdsCorpus(name, split)``: any TFDS text data set with a string feature (``wikipedia``'s
  ``text``), read by random access through ``tfds.data_source``;
* ``MixtureCorpus([...], weights)``: several of them (Wikipedia + Gutenberg as in the paper),
  a corpus drawn by weight (default: proportional to size) for every document draw;
  ``make_corpus("tfds:wikipedia/20230601.en;path/to/gutenberg")`` builds it.

Every corpus has the methods ``PretrainingExamples`` uses: ``len``, ``sample_document(rng)``
(a document id, drawn with probability about proportional to its length), ``length(doc)``,
``read(doc, start, stop) -> (text, reaches_end)``, ``paragraphs_of(doc, text)``,
``group(doc)`` (documents of one group never serve as each other's random next segment) and
``estimated_chars()``.
"""

from __future__ import annotations

import functools
import glob
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from heads_jax.data.utf8 import check_utf8
from heads_jax.errors import UserError


class TextCorpus:
  """Documents of plain UTF-8 text files, read by byte range (nothing is held in memory).

  Args:
    paths: files, directories (every ``*.txt`` inside, sorted) or glob patterns.
    layout: ``"paragraphs"`` (one document per file, blank lines between paragraphs, wrapped
      lines) or ``"lines"`` (one paragraph or sentence per line, blank lines between documents).

  The index is one ``(file, start byte, end byte)`` row per document; every file is scanned
  once (it must be UTF-8: a ``UserError`` names the file and line otherwise), ``lines`` files a
  second time to find the blank lines.
  """

  def __init__(self, paths, layout: str = "paragraphs"):
    if layout not in ("paragraphs", "lines"):
      raise ValueError(f"layout must be 'paragraphs' or 'lines', got {layout!r}")
    self.layout = layout
    self.paths = _expand_paths(paths)
    if not self.paths:
      raise FileNotFoundError(f"no text files found in {paths!r}; pass files, directories of "
                              f"*.txt files or glob patterns")
    files, starts, ends = [], [], []
    for f, path in enumerate(self.paths):
      check_utf8(path)
      spans = [(0, os.path.getsize(path))] if layout == "paragraphs" else _blank_line_spans(path)
      for s, e in spans:
        if e > s:
          files.append(f)
          starts.append(s)
          ends.append(e)
    if not files:
      raise ValueError(f"the text files {self.paths[:3]}... are empty")
    self.file = np.asarray(files, np.int32)
    self.start = np.asarray(starts, np.int64)
    self.end = np.asarray(ends, np.int64)
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
    return int(self.file[doc]) if self.layout == "paragraphs" else int(doc)

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
               accept_chars: int = 4000, source=None):
    self.name, self.split, self.data_dir, self.text_key = name, split, data_dir, text_key
    self.accept_chars = accept_chars
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

  def sample_document(self, rng: np.random.Generator) -> int:
    for _ in range(100):
      doc = int(rng.integers(0, len(self)))
      if rng.random() * self.accept_chars < self.length(doc):
        return doc
    return doc

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
                text_key: str = "text", weights: Sequence[float] | None = None):
  """A corpus from source strings separated by ``;`` (or a list of them); each is
  ``tfds:NAME`` (e.g. ``tfds:wikipedia/20230601.en``) or text paths separated by commas (files,
  directories of ``*.txt``, glob patterns). Several sources make a ``MixtureCorpus``."""
  if isinstance(sources, str):
    sources = [s.strip() for s in sources.split(";") if s.strip()]
  if not sources:
    raise ValueError("no pre-training data source given: set data.sources to text paths or "
                     "tfds:NAME")
  corpora = []
  for source in sources:
    if source.startswith("tfds:"):
      corpora.append(TfdsCorpus(source[len("tfds:"):], split, data_dir=data_dir or None,
                                text_key=text_key))
    else:
      corpora.append(TextCorpus([p for p in source.split(",") if p], layout=layout))
  if len(corpora) == 1:
    return corpora[0]
  return MixtureCorpus(corpora, weights)
