"""Examples -> encoded batches (DESIGN.md section 3 "Input encoding"; format in `batch.py`).

Each tokenizer applies its family's template (BERT, DistilBERT, ELECTRA, ALBERT:
``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]``; RoBERTa, XLM-RoBERTa: ``<s> A </s>`` and
``<s> A </s></s> B </s>``). ``token_type_ids`` holds the *segment* of every position as DESIGN.md
section 3 defines it for any template (`template_segments`): 0 for the start token and A, 1 for B;
of the delimiters between A and B the first is 0 and the others 1; delimiters after B are 1. For
the BERT template this is BERT's token types; families without token types ignore the field in
the model (``heads_jax.model.config``) while the sieves still read the segments. At most
``max_length`` positions (default 128), pairs truncated longest-first exactly as the Hugging Face
tokenizers do (``truncation="longest_first"``: if the shorter segment fits in half the budget it
is kept whole and the longer one is cut to the rest; otherwise both are cut to half, the longer
one, or B on a tie, keeping the odd position).

``token_class`` marks the tokenizer's own start token (``[CLS]``, ``<s>``) and separator
(``[SEP]``, ``</s>``), and the comma and period pieces, with or without the word-boundary mark of
byte-level BPE (``Ġ``) and SentencePiece (``▁``).

A segment is encoded in one of three modes (`Segment.mode`):

- ``"words"``: pre-split words (CoNLL-U syntactic words). With a WordPiece tokenizer ->
  ``is_split_into_words``; with byte-level BPE or SentencePiece (whose pieces carry the space
  before a word) the words are joined with single spaces and encoded as ``"aligned"`` text, so
  that the model sees ordinary text. Either way every piece knows the index of the word it came
  from.
- ``"aligned"``: raw text plus parser words with character spans -> the text is tokenised with
  offsets and each wordpiece is given the parser word whose span overlaps the piece's
  characters (the first such word if a piece straddles two); a piece with no characters of a
  word (a lone ``Ġ``/``▁`` word-boundary piece) belongs to the word that follows it in the text. Never by searching for a piece's first occurrence, which is wrong for repeated words.
- ``"text"``: raw text only (no parse) -> word ids are the tokenizer's own pre-tokenised words.

Word indices run over the whole sequence: segment B's words continue after segment A's (after
all of A's words, counted before truncation, when the words are known; after the last kept
word of A in ``"text"`` mode). Arcs give ``dep_head`` (word index of the head) and ``dep_rel``
(`batch.RELATION_LABELS`; other labels -> REL_NONE). ``dep_head`` is -1, and then ``dep_rel`` is
always REL_NONE, for roots, words without a parse, and words whose head lost all its pieces to
truncation (or never had any).
"""

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from heads_jax.data import vocabulary as B

DEFAULT_MAX_LENGTH = 128
DEFAULT_BUCKET_STEP = 16


@dataclasses.dataclass(frozen=True)
class Segment:
  """One segment (sentence A or B) to encode.

  ``text``: raw text (modes "aligned" and "text"; optional for "words"). ``words``: the words
  (CoNLL-U syntactic words, or a parser's words). ``spans``: character (start, end) of each word
  in ``text`` (parser words; None for pre-split words). ``heads``: head word index per word,
  0-based within this segment, -1 for a root or no arc. ``deprels``: relation label per word.
  """
  text: str | None = None
  words: tuple[str, ...] | None = None
  spans: tuple[tuple[int, int], ...] | None = None
  heads: tuple[int, ...] | None = None
  deprels: tuple[str, ...] | None = None

  def __post_init__(self):
    if self.text is None and self.words is None:
      raise ValueError("a Segment needs text or words")
    if self.spans is not None and (self.words is None or self.text is None):
      raise ValueError("a Segment with spans needs the text and the words")
    n = None if self.words is None else len(self.words)
    for name in ("spans", "heads", "deprels"):
      value = getattr(self, name)
      if value is not None and len(value) != n:
        raise ValueError(f"Segment.{name} has {len(value)} entries for {n} words")
    if (self.heads is None) != (self.deprels is None):
      raise ValueError("Segment.heads and Segment.deprels go together")
    if self.heads is not None and any(not -1 <= h < n for h in self.heads):
      raise ValueError(f"Segment.heads must be word indices 0..{n - 1} or -1, got {self.heads}")
    if self.spans is not None:
      starts = np.array([s for s, _ in self.spans], np.int64)
      ends = np.array([e for _, e in self.spans], np.int64)
      if (np.any(np.diff(starts) < 0) or np.any(np.diff(ends) < 0) or np.any(ends < starts)
          or (len(ends) and (starts[0] < 0 or ends[-1] > len(self.text)))):
        raise ValueError("Segment.spans must be ordered, non-overlapping character spans "
                         "inside the text")

  @property
  def mode(self) -> str:
    if self.spans is not None:
      return "aligned"
    return "words" if self.words is not None else "text"

  @property
  def has_arcs(self) -> bool:
    return self.heads is not None

  @property
  def num_words(self) -> int | None:
    return None if self.words is None else len(self.words)

  @classmethod
  def from_sentence(cls, sentence, arcs: bool = True) -> "Segment":
    """From a `conllu.Sentence`: pre-split syntactic words, gold arcs (unless ``arcs=False``)."""
    return cls(text=sentence.text, words=tuple(sentence.forms),
               heads=sentence.head_indices() if arcs else None,
               deprels=tuple(sentence.deprels) if arcs else None)

  @classmethod
  def from_parse(cls, parsed, arcs: bool = True) -> "Segment":
    """From a `syntax.ParsedText`: the raw text aligned to the parser's words by span."""
    return cls(text=parsed.text, words=tuple(parsed.words), spans=tuple(parsed.spans),
               heads=tuple(parsed.heads) if arcs else None,
               deprels=tuple(parsed.deprels) if arcs else None)

  @classmethod
  def from_text(cls, text: str) -> "Segment":
    """Raw text without a parse."""
    return cls(text=text)


@dataclasses.dataclass(frozen=True)
class AnalysisExample:
  """A single segment ``a`` or a pair (``a``, ``b``), with an optional class label."""
  a: Segment
  b: Segment | None = None
  label: int | None = None

  @property
  def key(self) -> tuple:
    return (self.a.mode, None if self.b is None else self.b.mode)


def align_pieces_to_words(offsets, spans) -> np.ndarray:
  """Word index of each wordpiece by character overlap, int32 ``[p]``.

  offsets: ``[p, 2]`` character (start, end) of each piece; spans: ``[w, 2]`` ordered,
  non-overlapping word spans in the same text. A piece gets the first word whose span overlaps
  its characters, -1 if none does (or for a (0, 0) special-token offset).
  """
  offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
  spans = np.asarray(spans, np.int64).reshape(-1, 2)
  out = np.full(len(offsets), -1, np.int32)
  if len(spans) == 0 or len(offsets) == 0:
    return out
  starts, ends = spans[:, 0], spans[:, 1]
  ps, pe = offsets[:, 0], np.maximum(offsets[:, 1], offsets[:, 0] + 1)
  j = np.searchsorted(ends, ps, side="right")  # first word ending after the piece starts
  jc = np.minimum(j, len(spans) - 1)
  ok = (j < len(spans)) & (starts[jc] < pe) & (offsets[:, 1] > offsets[:, 0])
  out[ok] = jc[ok]
  return out


def _token_class(ids: np.ndarray, special: dict, seq: np.ndarray) -> np.ndarray:
  """TOKEN_* per position; the start token and the separator count only where the template put
  them (``seq`` -1), punctuation only inside the texts."""
  cls = np.full(ids.shape, B.TOKEN_OTHER, np.int32)
  for token_id, value in special.items():
    if token_id is not None:
      where = (seq < 0) if value in (B.TOKEN_CLS, B.TOKEN_SEP) else (seq >= 0)
      cls[(ids == token_id) & where] = value
  return cls


# Spellings of the comma and period pieces: plain, byte-level BPE (space before), SentencePiece.
_PUNCTUATION = {B.TOKEN_COMMA: (",", "\u0120,", "\u2581,"), B.TOKEN_PERIOD: (".", "\u0120.", "\u2581.")}


def _special_ids(tokenizer) -> dict:
  """token id -> TOKEN_* for the tokenizer's start token and separator (``[CLS]``/``<s>``,
  ``[SEP]``/``</s>``), and the comma and period pieces in the vocabulary."""
  vocab = tokenizer.get_vocab()
  out = {}
  for cls, spellings in _PUNCTUATION.items():
    for token in spellings:
      if token in vocab and vocab[token] != tokenizer.unk_token_id:
        out[vocab[token]] = cls
  out[tokenizer.cls_token_id] = B.TOKEN_CLS
  out[tokenizer.sep_token_id] = B.TOKEN_SEP
  return out


def is_wordpiece(tokenizer) -> bool:
  """True for a WordPiece tokenizer (BERT, DistilBERT, ELECTRA), False for byte-level BPE
  (RoBERTa) and SentencePiece (XLM-RoBERTa, ALBERT)."""
  return type(tokenizer.backend_tokenizer.model).__name__ == "WordPiece"


def template_segments(sequence_ids, pair: bool) -> np.ndarray:
  """The segment (0/1) of every position of one encoded single text or pair, int32 ``[n]``
  (DESIGN.md section 3), from the tokenizer's ``sequence_ids`` (0 for A, 1 for B, None for the
  template's special tokens): for a pair, the special tokens up to A's last piece and the first
  one after it are 0, B and every later special token 1 (an empty A ends at the start token).
  A single text is all 0."""
  seq = np.array([-1 if s is None else s for s in sequence_ids], np.int32)
  seg = np.zeros(len(seq), np.int32)
  if pair:
    a_at = np.flatnonzero(seq == 0)
    last_a = int(a_at[-1]) if a_at.size else 0
    seg[last_a + 2:] = 1
    seg[(seq == 1)] = 1
  return seg


def _as_aligned_text(seg: "Segment") -> "Segment":
  """A words-mode segment as text: the words joined by single spaces, with their spans."""
  spans, pos = [], 0
  for w in seg.words:
    spans.append((pos, pos + len(w)))
    pos += len(w) + 1
  return Segment(text=" ".join(seg.words), words=seg.words, spans=tuple(spans), heads=seg.heads,
                 deprels=seg.deprels)


def _attach_boundary_pieces(local: np.ndarray, offsets: np.ndarray, text: str, spans) -> np.ndarray:
  """Gives a piece that covers no word's characters (empty offsets or only whitespace: a lone
  ``Ġ``/``▁``) the word that follows it in the text (the first word starting at or after the
  piece's end), within one segment."""
  out = local.copy()
  starts = np.asarray([a for a, _ in spans], np.int64)
  for i in np.flatnonzero(out < 0):
    s, e = int(offsets[i, 0]), int(offsets[i, 1])
    if text[s:e].strip():
      continue
    j = int(np.searchsorted(starts, e, side="left"))
    if j < len(starts):
      out[i] = j
  return out


def _segment_arcs(seg: Segment):
  heads = np.asarray(seg.heads, np.int64)
  rels = np.array([B.RELATION_LABELS.get(r, B.REL_NONE) for r in seg.deprels], np.int32)
  return heads, rels


def _row(enc, example: AnalysisExample, special: dict) -> dict:
  """One encoded example (unpadded, every field int32 ``[n]``) from a tokenizers Encoding."""
  ids = np.asarray(enc.ids, np.int32)
  n = len(ids)
  seq = np.array([-1 if s is None else s for s in enc.sequence_ids], np.int32)
  segments = [example.a] if example.b is None else [example.a, example.b]
  local = np.full(n, -1, np.int32)
  if any(s.mode == "aligned" for s in segments):
    offsets = np.asarray(enc.offsets, np.int64).reshape(n, 2)
  for s, seg in enumerate(segments):
    where = seq == s
    if seg.mode == "aligned":
      local[where] = _attach_boundary_pieces(align_pieces_to_words(offsets[where], seg.spans),
                                             offsets[where], seg.text, seg.spans)
    else:
      local[where] = [-1 if w is None else w for w, keep in zip(enc.word_ids, where) if keep]
  # Word numbering over the sequence: B continues after A.
  a_words = example.a.num_words
  if a_words is None:
    in_a = local[seq == 0]
    a_words = int(in_a.max()) + 1 if in_a.size and in_a.max() >= 0 else 0
  word_offsets = (0, a_words)
  word_ids = np.where(local >= 0, local + np.where(seq == 1, a_words, 0), -1).astype(np.int32)
  dep_head = np.full(n, -1, np.int32)
  dep_rel = np.full(n, B.REL_NONE, np.int32)
  present = np.zeros(int(word_ids.max(initial=-1)) + 1, bool)  # word index -> has a piece
  present[word_ids[word_ids >= 0]] = True
  for s, seg in enumerate(segments):
    if not seg.has_arcs:
      continue
    pos = np.nonzero((seq == s) & (local >= 0))[0]
    if not pos.size:
      continue
    heads, rels = _segment_arcs(seg)
    h = heads[local[pos]]
    head_word = np.where(h >= 0, h + word_offsets[s], -1)
    valid = (head_word >= 0) & (head_word < len(present))
    valid[valid] = present[head_word[valid]]
    dep_head[pos] = np.where(valid, head_word, -1)
    dep_rel[pos] = np.where(valid, rels[local[pos]], B.REL_NONE)
  return {
      "input_ids": ids,
      "attention_mask": np.ones(n, np.int32),
      "token_type_ids": template_segments(enc.sequence_ids, example.b is not None),
      "token_class": _token_class(ids, special, seq),
      "word_ids": word_ids,
      "dep_head": dep_head,
      "dep_rel": dep_rel,
  }


def _text_for_subwords(ex: AnalysisExample) -> AnalysisExample:
  """Words-mode segments as aligned text (byte-level BPE and SentencePiece tokenizers)."""
  a = _as_aligned_text(ex.a) if ex.a.mode == "words" else ex.a
  b = _as_aligned_text(ex.b) if ex.b is not None and ex.b.mode == "words" else ex.b
  return ex if (a is ex.a and b is ex.b) else dataclasses.replace(ex, a=a, b=b)


def _check_max_length(max_length: int) -> None:
  if not isinstance(max_length, (int, np.integer)) or max_length < 4:
    raise ValueError(f"max_length must be an integer >= 4 ([CLS] A [SEP] B [SEP] needs room), "
                     f"got {max_length!r}")


def encode_examples(examples: Sequence[AnalysisExample], tokenizer,
                    max_length: int = DEFAULT_MAX_LENGTH) -> list[dict]:
  """Encodes examples; returns one unpadded row per example (dict field -> int32 ``[n]``,
  n <= max_length), in order. Examples are tokenised in groups of the same mode (one fast
  tokenizer call per group)."""
  _check_max_length(max_length)
  if not getattr(tokenizer, "is_fast", False):
    raise TypeError("encoding needs a fast (Rust) tokenizer for word ids and character offsets; "
                    "load one with heads_jax.data.tokenizer.load_tokenizer")
  special = _special_ids(tokenizer)
  if not is_wordpiece(tokenizer):
    examples = [_text_for_subwords(ex) for ex in examples]
  rows = [None] * len(examples)
  groups: dict[tuple, list[int]] = {}
  for i, ex in enumerate(examples):
    if ex.b is not None and (ex.a.mode == "words") != (ex.b.mode == "words"):
      raise ValueError("a pair must have both segments as pre-split words or both as text; "
                       f"got modes {ex.key}")
    groups.setdefault(ex.key, []).append(i)
  for (mode_a, mode_b), idxs in groups.items():
    words = mode_a == "words"
    first = [list(examples[i].a.words) if words else examples[i].a.text for i in idxs]
    second = None
    if mode_b is not None:
      second = [list(examples[i].b.words) if words else examples[i].b.text for i in idxs]
    enc = tokenizer(first, second, is_split_into_words=words, add_special_tokens=True,
                    truncation="longest_first" if second is not None else True,
                    max_length=int(max_length), padding=False,
                    return_offsets_mapping="aligned" in (mode_a, mode_b))
    for j, i in enumerate(idxs):
      rows[i] = _row(enc.encodings[j], examples[i], special)
  return rows


def encode_texts(tokenizer, first: Sequence[str], second: Sequence[str] | None = None, *,
                 max_length: int, pad_to_max_length: bool = True) -> dict:
  """Model inputs of raw texts or pairs (fine-tuning, ablation): ``input_ids``,
  ``attention_mask`` and ``token_type_ids`` (the segments of `template_segments`, 0 on padding),
  int32 ``[n, q]``, q = ``max_length`` or the longest sequence; pairs truncated longest-first."""
  enc = tokenizer(list(first), None if second is None else list(second),
                  truncation="longest_first" if second is not None else True,
                  max_length=int(max_length),
                  padding="max_length" if pad_to_max_length else "longest")
  ids = np.asarray(enc["input_ids"], np.int32)
  mask = np.asarray(enc["attention_mask"], np.int32)
  segments = np.stack([template_segments(e.sequence_ids, second is not None)
                       for e in enc.encodings]).astype(np.int32)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments * mask}


def bucket_lengths(max_length: int = DEFAULT_MAX_LENGTH,
                   step: int = DEFAULT_BUCKET_STEP) -> tuple[int, ...]:
  """The padded lengths a batch may get: multiples of ``step`` below ``max_length``, and
  ``max_length`` itself (a small set, so jit compiles few shapes)."""
  if step <= 0:
    raise ValueError(f"bucket step must be positive, got {step}")
  return tuple(range(step, max_length, step)) + (max_length,)


def padded_length(n: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= n."""
  for k in buckets:
    if k >= n:
      return int(k)
  raise ValueError(f"sequence length {n} exceeds the largest bucket {max(buckets)}")


def collate(rows: Sequence[dict], k: int, b: int | None = None) -> dict:
  """Pads rows to a batch ``[b, k]`` (`batch.empty_batch` defaults on padding); rows beyond
  ``len(rows)`` (when ``b`` is larger) are all padding."""
  b = len(rows) if b is None else b
  batch = B.empty_batch(b, k)
  for i, row in enumerate(rows):
    n = len(row["input_ids"])
    if n > k:
      raise ValueError(f"row {i} has {n} positions, more than the padded length {k}")
    for f in B.BATCH_FIELDS:
      batch[f][i, :n] = row[f]
  return batch


def encode_batch(examples: Sequence[AnalysisExample], tokenizer,
                 max_length: int = DEFAULT_MAX_LENGTH, k: int | None = None) -> dict:
  """Encodes examples into one batch ``[b, k]``; ``k`` defaults to the longest sequence."""
  rows = encode_examples(examples, tokenizer, max_length)
  if k is None:
    k = max((len(r["input_ids"]) for r in rows), default=1)
  return collate(rows, k)


def iter_batches(examples: Iterable[AnalysisExample], tokenizer, *,
                 max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 32,
                 sort_window: int | None = None, bucket_step: int = DEFAULT_BUCKET_STEP,
                 pad_to_batch_size: bool = False) -> Iterator[tuple[np.ndarray, dict]]:
  """Streams encoded batches: yields ``(indices, batch)``.

  ``indices``: int64 ``[b]``, each row's position in ``examples`` (-1 for filler rows).
  ``batch``: `batch.BATCH_FIELDS` -> int32 ``[b, k]``, k the smallest of `bucket_lengths`
  holding the batch's longest sequence. Examples are read lazily, ``max(batch_size,
  sort_window)`` at a time. ``sort_window``: if set, each window of about that many examples
  (rounded up to whole batches) is ordered by length, longest first, before it is cut into
  batches, to save padding; put results back in order with the indices. ``pad_to_batch_size``:
  fill a short last batch with all-padding rows (index -1) so that b is always ``batch_size``.
  """
  _check_max_length(max_length)
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  buckets = bucket_lengths(max_length, bucket_step)
  window = batch_size
  if sort_window:
    window = -(-int(sort_window) // batch_size) * batch_size
  return _stream(iter(examples), tokenizer, max_length, batch_size, window, bool(sort_window),
                 buckets, pad_to_batch_size)


def _stream(it, tokenizer, max_length, batch_size, window, sort, buckets, pad_to_batch_size):
  start = 0
  while True:
    chunk = []
    for ex in it:
      chunk.append(ex)
      if len(chunk) >= window:
        break
    if not chunk:
      return
    rows = encode_examples(chunk, tokenizer, max_length)
    order = np.arange(len(rows))
    if sort:
      lens = np.array([len(r["input_ids"]) for r in rows])
      order = np.argsort(-lens, kind="stable")
    for s in range(0, len(order), batch_size):
      sel = order[s:s + batch_size]
      picked = [rows[i] for i in sel]
      k = padded_length(max(len(r["input_ids"]) for r in picked), buckets)
      b = batch_size if pad_to_batch_size else len(picked)
      indices = np.full(b, -1, np.int64)
      indices[:len(sel)] = sel + start
      yield indices, collate(picked, k, b)
    start += len(chunk)
    if len(chunk) < window:
      return


# ------------------------------------------------------------------------------------------------
# Packed batches: several sequences per row (issue 38). A packed batch is an encoded batch whose
# rows hold one or more whole sequences one after another, plus the field ``segment_ids``
# ``[b, k]``: 1, 2, ... for the sequences of a row (its "slots"), 0 on the padding at the row's
# end. Every other field keeps each sequence's own values (its token types, word ids and arcs
# are numbered inside the sequence, as unpacked). The model attends within a sequence only and
# restarts positions per sequence, and the statistics are per sequence, so each sequence's
# scores equal its unpacked ones (tests/stats/test_packing.py).

DEFAULT_SLOTS = 16        # sequences per packed row at most (the statistics' slot axis S)


def pack_lengths(lengths: Sequence[int], capacity: int, slots: int = DEFAULT_SLOTS) -> list[list[int]]:
  """First-fit decreasing: the sequences (by index into ``lengths``) of each packed row, rows
  holding at most ``capacity`` positions and ``slots`` sequences, longest sequences first (so
  short ones fill the gaps). Deterministic; every index appears exactly once."""
  if slots < 1:
    raise ValueError(f"slots must be >= 1, got {slots}")
  order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
  rows, free = [], []
  for i in order:
    n = int(lengths[i])
    if n > capacity:
      raise ValueError(f"sequence {i} has {n} positions, more than the packed row's {capacity}")
    for r, room in enumerate(free):
      if room >= n and len(rows[r]) < slots:
        rows[r].append(i)
        free[r] -= n
        break
    else:
      rows.append([i])
      free.append(capacity - n)
  return rows


def collate_packed(seqs: Sequence[dict], rows: Sequence[Sequence[int]], k: int, b: int,
                   slots: int) -> tuple[np.ndarray, dict]:
  """Packed batch ``[b, k]`` of the sequences ``seqs`` (unpadded rows, each field ``[n]``) laid out
  as ``rows`` (lists of indices into ``seqs``, ``len(rows) <= b``; further rows all padding).
  Returns ``(slot_of, batch)``: ``slot_of`` int64 ``[b * slots]`` gives the index into ``seqs``
  of slot j of row i at ``i * slots + j`` (-1 for an empty slot), ``batch`` the BATCH_FIELDS
  plus ``segment_ids``."""
  if len(rows) > b:
    raise ValueError(f"{len(rows)} packed rows do not fit a batch of {b}")
  batch = B.empty_batch(b, k)
  batch["segment_ids"] = np.zeros((b, k), np.int32)
  slot_of = np.full(b * slots, -1, np.int64)
  for i, members in enumerate(rows):
    if len(members) > slots:
      raise ValueError(f"row {i} packs {len(members)} sequences, more than {slots} slots")
    start = 0
    for j, s in enumerate(members):
      seq = seqs[s]
      n = len(seq["input_ids"])
      if start + n > k:
        raise ValueError(f"row {i} packs {start + n} positions, more than {k}")
      for f in B.BATCH_FIELDS:
        batch[f][i, start:start + n] = seq[f]
      batch["segment_ids"][i, start:start + n] = j + 1
      slot_of[i * slots + j] = s
      start += n
  return slot_of, batch


def unpad_rows(indices, batch: dict) -> list[tuple[int, dict]]:
  """The real sequences of an unpacked batch as ``(index, row)`` with each field ``[n]``
  (filler rows, index -1, dropped)."""
  out = []
  mask = np.asarray(batch["attention_mask"])
  for i, index in enumerate(np.asarray(indices)):
    if index < 0:
      continue
    n = int(mask[i].sum())
    out.append((int(index), {f: np.asarray(batch[f])[i, :n] for f in B.BATCH_FIELDS}))
  return out


SHORT_ROWS_LONG_SHARE = 0.25  # short rows only while at most this share of positions is longer


def row_slots(row_length: int, length: int, slots: int = DEFAULT_SLOTS) -> int:
  """Sequences a packed row of ``row_length`` positions holds at most, where a row of ``length``
  holds ``slots``: in proportion (a short row of half the length: half the slots), at least 1."""
  return max(1, slots * int(row_length) // int(length))


def pack_batches(batches: Iterable, *, length: int, rows: int, slots: int = DEFAULT_SLOTS,
                 window: int = 1024, tail_rows: int | None = None,
                 short_length: int | None = None) -> Iterator[tuple[np.ndarray, dict]]:
  """Packed batches from unpacked ``(indices, batch)`` (e.g. ``iter_batches`` / ``encode_spec``):
  yields ``(indices [b * S], packed batch [b, k])``, each index the sequence's position in the
  data (-1: empty slot), in slot order (``collate_packed``; S = ``row_slots(k, length, slots)``).

  Sequences are gathered ``window`` at a time and packed first-fit decreasing
  (``pack_lengths``); packed rows left over from a window wait for the next one.

  * Without ``short_length``: rows of ``length`` positions, in batches of ``rows``; the rows
    left at the end go out in batches of ``tail_rows`` rows (default ``rows // 4``, at least 1),
    so a pass compiles at most two shapes, ``[rows, length]`` and ``[tail_rows, length]``, and
    the last batch wastes at most ``tail_rows - 1`` rows.
  * With ``short_length`` s < ``length`` (the device pass: half of it): longer sequences go to
    rows of ``length`` (in batches of ``tail_rows``), the others fill those rows' room and then
    short rows of s positions (in batches of ``rows * length // s`` rows, the same positions as
    a full batch); at the end the sequences of the rows left over are packed again, into rows of
    ``length``, in batches of ``tail_rows``. Two shapes again, ``[rows * length // s, s]`` and
    ``[tail_rows, length]``. A short row's attention has half the query-key pairs per position,
    and the statistics' per-layer cost goes with the pairs (BENCHMARKS.md, issue 38). The first
    window decides: if more than ``SHORT_ROWS_LONG_SHARE`` of its positions are in sequences
    longer than s (e.g. sentence pairs), the whole stream packs as without ``short_length``.
  """
  if rows < 1 or length < 1:
    raise ValueError(f"rows and length must be positive, got {rows}, {length}")
  if short_length is not None and not 1 <= short_length:
    raise ValueError(f"short_length must be positive, got {short_length}")
  tail_rows = max(1, rows // 4) if tail_rows is None else int(tail_rows)
  pending_seqs: list[tuple[int, dict]] = []
  ready: list[list[tuple[int, dict]]] = []        # packed rows of `length` waiting for a batch
  ready_short: list[list[tuple[int, dict]]] = []  # short rows waiting for a batch
  tier: list[int] = []                            # [s] or [0], decided at the first window
  n_of = lambda item: len(item[1]["input_ids"])   # noqa: E731

  def pack_rows(seqs, capacity):
    layout = pack_lengths([n_of(x) for x in seqs], capacity, row_slots(capacity, length, slots))
    return [[seqs[i] for i in members] for members in layout]

  def pack_pending():
    if not tier:
      s = int(short_length or 0)
      total = sum(n_of(x) for x in pending_seqs)
      longer = sum(n_of(x) for x in pending_seqs if n_of(x) > s)
      tier.append(s if 0 < s < length and longer <= SHORT_ROWS_LONG_SHARE * total else 0)
    s = tier[0]
    long_rows = pack_rows([x for x in pending_seqs if not s or n_of(x) > s], length)
    shorts = sorted((x for x in pending_seqs if s and n_of(x) <= s), key=lambda x: -n_of(x))
    room = [length - sum(n_of(x) for x in row) for row in long_rows]
    rest = []
    for x in shorts:   # the long rows' room first (first fit, longest first), then short rows
      r = next((r for r, free in enumerate(room)
                if free >= n_of(x) and len(long_rows[r]) < slots), None)
      if r is None:
        rest.append(x)
      else:
        long_rows[r].append(x)
        room[r] -= n_of(x)
    ready.extend(long_rows)
    ready_short.extend(pack_rows(rest, s or length))
    pending_seqs.clear()

  def emit(group, b, k):
    seqs = [item for row in group for item in row]
    layout, at = [], 0
    for row in group:
      layout.append(list(range(at, at + len(row))))
      at += len(row)
    slot_of, batch = collate_packed([r for _, r in seqs], layout, k, b, row_slots(k, length, slots))
    indices = np.where(slot_of >= 0, np.asarray([i for i, _ in seqs] + [-1])[slot_of], -1)
    return indices.astype(np.int64), batch

  def full_batches():
    s = tier[0] if tier else 0
    if s:
      short_rows = rows * length // s
      while len(ready_short) >= short_rows:
        yield emit(ready_short[:short_rows], short_rows, s)
        del ready_short[:short_rows]
    long_rows = tail_rows if s else rows
    while len(ready) >= long_rows:
      yield emit(ready[:long_rows], long_rows, length)
      del ready[:long_rows]

  for indices, batch in batches:
    pending_seqs.extend(unpad_rows(indices, batch))
    if len(pending_seqs) >= window:
      pack_pending()
      yield from full_batches()
  if pending_seqs:
    pack_pending()
  yield from full_batches()
  if ready_short:   # the short rows left over, with the long ones, packed again at full length
    ready[:] = pack_rows([x for row in ready_short + ready for x in row], length)
    ready_short.clear()
  while ready:
    yield emit(ready[:tail_rows], tail_rows, length)
    del ready[:tail_rows]
