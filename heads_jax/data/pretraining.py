"""BERT pre-training examples (masked LM + next-sentence prediction), streamed and deterministic.

Each example follows google-research/bert ``create_pretraining_data.py``:

* a target length of ``max_seq_length - 3`` wordpieces, or with probability
  ``short_seq_prob`` (0.1) a random length in ``[2, max_seq_length - 3]``;
* a chunk of consecutive sentences of one document, accumulated until it reaches the target
  length (or the document ends); segment A is its first ``a_end`` sentences (``a_end`` random
  in ``[1, len(chunk) - 1]``);
* segment B is the rest of the chunk, or with probability ``random_next_prob`` (0.5, and always
  when the chunk is a single sentence) sentences from a random place in *another* document
  (another book for the ``paragraphs`` layout), label ``next_sentence_label = 1``;
* the pair is truncated to ``max_seq_length - 3`` by removing wordpieces from the front or back
  (at random) of the longer segment, then laid out as ``[CLS] A [SEP] B [SEP]``;
* ``min(max_predictions, max(1, round(n * masked_lm_prob)))`` positions (n = the sequence's
  length *including* its three special tokens, as the recipe) chosen at random among the
  non-special positions (whole words when ``whole_word_mask``); each chosen position becomes
  ``[MASK]`` with probability 0.8, a random vocabulary id with probability 0.1 (any id, as the
  recipe) and stays unchanged with probability 0.1.

Where this differs from the recipe, on purpose: the recipe walks every document in order,
writes all instances (``dupe_factor`` differently masked copies) to disk and shuffles them in
memory. Here example ``i`` is a pure function of ``(seed, i)``: it draws a document with
probability proportional to its length, a random place in it, and builds the chunk from the first
sentence that starts after that place. So examples are i.i.d. draws (no shuffle buffer is
needed), nothing is held in memory but a small index of document byte offsets, batch ``N`` of
the stream is ``examples[N * B : (N + 1) * B]`` (a run resumed at step N sees exactly the
batches an uninterrupted run would), and each host process builds only its own rows of the
global batch (``process_index`` / ``process_count`` passed in).

Sentence splitting (``split_sentences``) is a simple regular expression: a sentence ends at
``.``, ``!`` or ``?`` (optionally followed by closing quotes or brackets) followed by white space
and an upper-case letter, digit or opening quote; no split after common abbreviations ("Mr.",
"Dr.", "St.", ...) or single-letter initials ("H. G. Wells"). Paragraph breaks always end a
sentence.

Corpora:

* ``TextCorpus(paths, layout="paragraphs")``: plain UTF-8 files where each file is one
  document (a book) and paragraphs are separated by blank lines with wrapped lines inside
  (the layout of ``/work/shared/data/corpus/gutenberg``);
* ``TextCorpus(paths, layout="lines")``: the recipe's input layout: one sentence or paragraph
  per line, blank lines between documents (Wikipedia dumps prepared for BERT);
* ``TfdsCorpus(name, split)``: any TFDS text data set with a string feature (``wikipedia``'s
  ``text``), read by random access through ``tfds.data_source``;
* ``MixtureCorpus([...], weights)``: several of them (Wikipedia + Gutenberg as in the paper),
  a corpus drawn by weight (default: proportional to size) for every document draw;
  ``make_corpus("tfds:wikipedia/20230601.en;path/to/gutenberg")`` builds it.

Batches are numpy dicts: ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[b, q]``;
``masked_positions``, ``masked_ids`` int32 and ``masked_weights`` float32 ``[b, p]``
(p = ``max_predictions``; padding slots have position 0, id 0, weight 0);
``next_sentence_label`` int32 ``[b]`` (0 = B follows A, 1 = B is random).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import queue
import re
import threading
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

# ------------------------------------------------------------------------------------------------
# Sentence splitting

_ABBREVIATIONS = frozenset("""
mr mrs ms dr st prof sr jr vs etc esq rev hon capt col gen gov lt sgt mt messrs mme mlle
vol ch fig cf al inc ltd co jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
_BOUNDARY = re.compile(r"""([.!?]+["'\u2019\u201d)\]]*)\s+(?=["'\u2018\u201c(\[_]*[A-Z0-9])""")
_LAST_WORD = re.compile(r"([A-Za-z]+)\.*$")


def split_sentences(paragraph: str) -> list[str]:
  """Splits one paragraph (any internal white space) into sentences; see the module docstring."""
  text = " ".join(paragraph.split())
  if not text:
    return []
  sentences, start = [], 0
  for m in _BOUNDARY.finditer(text):
    end = m.end(1)
    head = text[start:end]
    word = _LAST_WORD.search(head.rstrip("\"'\u2019\u201d)]!?"))
    if m.group(1).startswith(".") and word is not None:
      w = word.group(1)
      if w.lower() in _ABBREVIATIONS or (len(w) == 1 and w.isupper()):
        continue
    sentences.append(head)
    start = m.end()
  sentences.append(text[start:])
  return [s for s in sentences if s]


# ------------------------------------------------------------------------------------------------
# Corpora: random access to documents

class TextCorpus:
  """Documents of plain UTF-8 text files, read by byte range (nothing is held in memory).

  Args:
    paths: files, directories (every ``*.txt`` inside, sorted) or glob patterns.
    layout: ``"paragraphs"`` (one document per file, blank lines between paragraphs, wrapped
      lines) or ``"lines"`` (one paragraph or sentence per line, blank lines between documents).

  The index is one ``(file, start byte, end byte)`` row per document; ``lines`` files are
  scanned once to find the blank lines.
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
    return data.decode("utf-8", errors="ignore"), finish >= int(self.end[doc])

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

  def paragraphs(self, text: str) -> list[str]:
    return [line for line in text.split("\n") if line.strip()]


def _tfds_source(name: str, split: str, data_dir):
  import tensorflow_datasets as tfds
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
    raise RuntimeError(f"could not open TFDS data set {name!r} split {split!r} in data_dir "
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


# ------------------------------------------------------------------------------------------------
# Examples



def _chop(sentence: str, max_chars: int) -> list[str]:
  """A "sentence" longer than ``max_chars`` (text without full stops) cut at spaces into pieces;
  such a sentence would be truncated to the sequence length anyway."""
  if len(sentence) <= max_chars:
    return [sentence]
  pieces, start = [], 0
  while start < len(sentence):
    end = min(len(sentence), start + max_chars)
    if end < len(sentence):
      space = sentence.rfind(" ", start + 1, end)
      end = space if space > start else end
    pieces.append(sentence[start:end].strip())
    start = end
  return [p for p in pieces if p]

@dataclasses.dataclass(frozen=True)
class PretrainingSpec:
  """The recipe's parameters (defaults: sequence length 128, 20 predictions)."""
  max_seq_length: int = 128
  max_predictions: int = 20
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  random_next_prob: float = 0.5
  whole_word_mask: bool = False

  def __post_init__(self):
    if self.max_seq_length < 5:
      raise ValueError(f"max_seq_length must be at least 5, got {self.max_seq_length}")
    if not 0 < self.max_predictions <= self.max_seq_length:
      raise ValueError(f"max_predictions must be in [1, max_seq_length], got {self.max_predictions}")


class PretrainingExamples:
  """Example ``i`` (an int) of the stream defined by ``(corpus, tokenizer, spec, seed)``.

  Args:
    corpus: a ``TextCorpus`` or ``TfdsCorpus`` (or anything with their methods).
    tokenizer: a ``transformers.BertTokenizerFast`` (``heads_jax.data.tokenizer.load_tokenizer``).
    spec: ``PretrainingSpec``.
    seed: non-negative int; example ``i`` uses ``np.random.default_rng([seed, i])``.
  """

  def __init__(self, corpus, tokenizer, spec: PretrainingSpec = PretrainingSpec(), seed: int = 0):
    if seed < 0:
      raise ValueError(f"seed must be >= 0, got {seed}")
    self.corpus, self.tokenizer, self.spec, self.seed = corpus, tokenizer, spec, int(seed)
    self.cls_id = tokenizer.cls_token_id
    self.sep_id = tokenizer.sep_token_id
    self.mask_id = tokenizer.mask_token_id
    self.pad_id = tokenizer.pad_token_id or 0
    self.vocab_size = int(tokenizer.vocab_size)
    self._max_sentence_chars = 10 * spec.max_seq_length
    self._is_subword = None
    if spec.whole_word_mask:
      tokens = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
      self._is_subword = np.array([t.startswith("##") for t in tokens])

  # -- tokenised sentences at a random place of a document ---------------------------------------

  def _tokenize(self, sentences: list[str]) -> list[list[int]]:
    if not sentences:
      return []
    return self.tokenizer(sentences, add_special_tokens=False)["input_ids"]

  def _sentences_at(self, doc: int, rng: np.random.Generator, min_tokens: int) -> list[list[int]]:
    """Tokenised consecutive sentences of ``doc`` from the first sentence that starts after a
    random byte, accumulated until they hold ``min_tokens`` wordpieces or the document ends."""
    n = self.corpus.length(doc)
    if n <= 0:
      return []
    for attempt in range(8):
      start = int(rng.integers(0, n)) if attempt < 7 else 0
      window = 256 + 8 * min_tokens
      while True:
        text, at_end = self.corpus.read(doc, start, start + window)
        sentences = [piece for p in _paragraphs(self.corpus, doc, text) for s in split_sentences(p)
                     for piece in _chop(s, self._max_sentence_chars)]
        if start > 0:
          sentences = sentences[1:]  # the first one is (most likely) cut
        if not at_end:
          sentences = sentences[:-1]  # so is the last one
        # Tokenise a few sentences at a time (most of the window is not needed): the same
        # wordpieces as tokenising the whole window, at a fraction of the cost.
        total, chunk, i, group = 0, [], 0, 4
        while i < len(sentences):
          for t in self._tokenize(sentences[i:i + group]):
            if not t:
              continue
            chunk.append(t)
            total += len(t)
            if total >= min_tokens:
              return chunk
          i += group
          group *= 2
        if at_end or window >= 64 * (256 + 8 * min_tokens):
          if chunk:
            return chunk
          break  # no complete sentence after `start`: draw another place
        window *= 2
    return []

  # -- one example ---------------------------------------------------------------------------------

  def example(self, index: int) -> dict:
    """Example ``index``: unpadded ``tokens``/``segment_ids`` lists, masked predictions and label."""
    spec = self.spec
    rng = np.random.default_rng([self.seed, int(index)])
    max_num_tokens = spec.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < spec.short_seq_prob:
      target = int(rng.integers(2, max_num_tokens + 1))
    chunk = []
    for _ in range(100):
      doc = self.corpus.sample_document(rng)
      chunk = self._sentences_at(doc, rng, target)
      if chunk:
        break
    if not chunk:
      raise ValueError("the corpus yields no sentences: is it empty or not text?")
    a_end = 1 if len(chunk) < 2 else int(rng.integers(1, len(chunk)))
    tokens_a = [t for s in chunk[:a_end] for t in s]
    if len(chunk) == 1 or rng.random() < spec.random_next_prob:
      is_random_next = True
      target_b = max(1, target - len(tokens_a))
      group = self.corpus.group(doc)
      tokens_b = []
      for _ in range(100):
        other = doc
        for _ in range(10):  # as the recipe: up to 10 tries to find another document
          other = self.corpus.sample_document(rng)
          if self.corpus.group(other) != group:
            break
        tokens_b = [t for s in self._sentences_at(other, rng, target_b) for t in s]
        if tokens_b:
          break
    else:
      is_random_next = False
      tokens_b = [t for s in chunk[a_end:] for t in s]
    _truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
    tokens = [self.cls_id] + tokens_a + [self.sep_id] + tokens_b + [self.sep_id]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    tokens, positions, labels = self._mask(tokens, rng)
    return {"tokens": tokens, "segment_ids": segment_ids, "masked_positions": positions,
            "masked_ids": labels, "next_sentence_label": int(is_random_next)}

  def _mask(self, tokens: list[int], rng: np.random.Generator):
    """The recipe's ``create_masked_lm_predictions``: returns (tokens, positions, original ids)."""
    spec = self.spec
    candidates = []
    for i, t in enumerate(tokens):
      if t in (self.cls_id, self.sep_id):
        continue
      if spec.whole_word_mask and candidates and candidates[-1][-1] == i - 1 and self._is_subword[t]:
        candidates[-1].append(i)  # (a "##" piece right after [CLS]/[SEP] starts its own word)
      else:
        candidates.append([i])
    order = rng.permutation(len(candidates))
    num_to_predict = min(spec.max_predictions, max(1, int(round(len(tokens) * spec.masked_lm_prob))))
    output = list(tokens)
    chosen = []
    for c in order:
      word = candidates[c]
      if len(chosen) >= num_to_predict:
        break
      if len(chosen) + len(word) > num_to_predict:
        continue
      for i in word:
        if rng.random() < 0.8:
          output[i] = self.mask_id
        elif rng.random() < 0.5:
          output[i] = tokens[i]
        else:
          output[i] = int(rng.integers(0, self.vocab_size))
        chosen.append(i)
    chosen.sort()
    return output, chosen, [tokens[i] for i in chosen]

  def unigram_entropy(self, num_examples: int = 2048) -> float:
    """The unigram baseline of the MLM loss, in nats per wordpiece.

    Entropy of the wordpiece frequencies over examples ``0 .. num_examples - 1`` (masked
    positions restored to their original wordpieces; [CLS], [SEP] and padding left out): the
    loss of a model that predicts every masked wordpiece from its corpus frequency alone,
    without context. A pre-trained model's held-out MLM loss must fall below it. Estimated
    from a sample (plug-in); its downward bias is about (types seen) / (2 x tokens counted),
    0.01 nats for 2,048 examples of 128 wordpieces.
    """
    if num_examples < 1:
      raise ValueError("num_examples must be at least 1")
    counts = np.zeros(self.vocab_size, np.int64)
    for i in range(num_examples):
      ex = self.example(i)
      tokens = np.asarray(ex["tokens"], np.int64)
      if len(ex["masked_positions"]):
        tokens[np.asarray(ex["masked_positions"])] = ex["masked_ids"]
      tokens = tokens[(tokens != self.cls_id) & (tokens != self.sep_id) & (tokens != self.pad_id)]
      counts += np.bincount(tokens, minlength=self.vocab_size)[:self.vocab_size]
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())

  # -- batches -------------------------------------------------------------------------------------

  def batch(self, step: int, batch_size: int, process_index: int = 0, process_count: int = 1) -> dict:
    """This process's rows of global batch ``step`` (examples ``step * batch_size + row``).

    ``batch_size`` is the global batch size; it must be divisible by ``process_count``; process
    ``p`` gets rows ``[p * B / P, (p + 1) * B / P)``.
    """
    if batch_size % process_count:
      raise ValueError(f"global batch size {batch_size} is not divisible by the number of host "
                       f"processes {process_count}")
    local = batch_size // process_count
    first = int(step) * batch_size + process_index * local
    return self.collate([self.example(first + r) for r in range(local)])

  def collate(self, examples: Sequence[dict]) -> dict:
    """Pads examples into the batch dict of the module docstring."""
    b, q, p = len(examples), self.spec.max_seq_length, self.spec.max_predictions
    out = {
        "input_ids": np.full((b, q), self.pad_id, np.int32),
        "attention_mask": np.zeros((b, q), np.int32),
        "token_type_ids": np.zeros((b, q), np.int32),
        "masked_positions": np.zeros((b, p), np.int32),
        "masked_ids": np.zeros((b, p), np.int32),
        "masked_weights": np.zeros((b, p), np.float32),
        "next_sentence_label": np.zeros((b,), np.int32),
    }
    for r, ex in enumerate(examples):
      n, m = len(ex["tokens"]), len(ex["masked_positions"])
      out["input_ids"][r, :n] = ex["tokens"]
      out["attention_mask"][r, :n] = 1
      out["token_type_ids"][r, :n] = ex["segment_ids"]
      out["masked_positions"][r, :m] = ex["masked_positions"]
      out["masked_ids"][r, :m] = ex["masked_ids"]
      out["masked_weights"][r, :m] = 1.0
      out["next_sentence_label"][r] = ex["next_sentence_label"]
    return out

  def batches(self, start_step: int, batch_size: int, *, process_index: int = 0,
              process_count: int = 1, prefetch: int = 2, num_workers: int = 0,
              num_steps: int | None = None) -> Iterator[dict]:
    """Batches ``start_step, start_step + 1, ...`` (endless unless ``num_steps``), built ahead.

    ``num_workers > 0`` builds batches in that many spawned processes (the tokenizer and the
    corpus are pickled to them); 0 uses one background thread. Either way the order and the
    contents are the same.
    """
    return _prefetch(self, start_step, batch_size, process_index, process_count,
                     prefetch, num_workers, num_steps)


def _paragraphs(corpus, doc: int, text: str) -> list[str]:
  if hasattr(corpus, "paragraphs_of"):
    return corpus.paragraphs_of(doc, text)
  return corpus.paragraphs(text)


def _truncate_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng) -> None:
  """The recipe's ``truncate_seq_pair``: trims the longer list from a random end, in place."""
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng.random() < 0.5:
      del trunc[0]
    else:
      trunc.pop()


# ------------------------------------------------------------------------------------------------
# Background batch building

_WORKER_EXAMPLES = None


def _worker_init(examples):
  global _WORKER_EXAMPLES
  _WORKER_EXAMPLES = examples


def _worker_batch(args):
  return _WORKER_EXAMPLES.batch(*args)


def _prefetch(examples, start_step, batch_size, process_index, process_count, prefetch,
              num_workers, num_steps):
  stop = None if num_steps is None else start_step + num_steps
  if num_workers > 0:
    import concurrent.futures as cf
    import multiprocessing as mp
    pool = cf.ProcessPoolExecutor(num_workers, mp_context=mp.get_context("spawn"),
                                  initializer=_worker_init, initargs=(examples,))
    try:
      pending = []
      step = start_step
      while stop is None or step < stop or pending:
        while len(pending) < max(prefetch, num_workers) and (stop is None or step < stop):
          pending.append(pool.submit(_worker_batch, (step, batch_size, process_index, process_count)))
          step += 1
        yield pending.pop(0).result()
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    return

  q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
  done = threading.Event()

  def put(item) -> bool:
    while not done.is_set():
      try:
        q.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce():
    step = start_step
    try:
      while not done.is_set() and (stop is None or step < stop):
        if not put(examples.batch(step, batch_size, process_index, process_count)):
          return
        step += 1
      put(None)
    except BaseException as e:  # surfaced in the consumer
      put(e)

  thread = threading.Thread(target=produce, daemon=True)
  thread.start()
  try:
    while True:
      item = q.get()
      if item is None:
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    done.set()


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


__all__ = ["split_sentences", "TextCorpus", "TfdsCorpus", "MixtureCorpus", "PretrainingSpec",
           "PretrainingExamples", "make_corpus"]
