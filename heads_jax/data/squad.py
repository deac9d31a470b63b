"""SQuAD (v1.1 and v2.0): the official JSON files and TFDS ``squad``, and the windowed
question/context features of BERT's reference ``run_squad.py`` for any family's tokenizer.

Reading (``read_squad_json``, ``read_squad_tfds``) gives one ``SquadExample`` per question.
Every answer is checked against its context (``context[answer_start:][:len(text)] == text``);
a file that is not SQuAD JSON, or an answer whose offset does not match its text, is refused with
one line (``UserError``). ``version``: ``"v1"`` keeps the answerable questions only (the v1.1
task; in a v2.0 file these are the SQuAD 1.1-style questions), ``"v2"`` keeps every question
(unanswerable ones have no answers and ``is_impossible``); None follows the file's
``"version"`` field.

Features (``build_features``), as ``convert_examples_to_features`` of BERT's ``run_squad.py``:
the question is cut to ``max_query_length`` (64) pieces; the context is cut into windows of at
most ``max_seq_length - len(question) - specials`` pieces (``max_seq_length`` 384), window ``i + 1``
starting ``min(len(window i), doc_stride)`` (128) pieces after window ``i``; each window is the
tokenizer's pair template with the question first (``[CLS] Q [SEP] C [SEP]``, RoBERTa
``<s> Q </s></s> C </s>``). Instead of the reference's whitespace words and WordPiece
re-tokenisation, the context is tokenised once with the fast tokenizer's character offsets, which
works for every family (WordPiece, byte-level BPE, SentencePiece): each window keeps, for every
position, the character span of its piece in the context (``offsets``, -1 outside the context)
and ``token_is_max_context`` (the reference's ``_check_is_max_context``: the window in which the
piece has the most context, ``min(left, right) + 0.01 * window length``). Training labels: the
pieces of the first answer's first and last character, or 0 (the start token) when the answer
is not wholly inside the window or the question is unanswerable, as the reference.

Arrays (``SquadFeatures``): ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]``
(``token_type_ids``: the segments of ``heads_jax.data.encoding.template_segments``),
``start_positions``, ``end_positions``, ``example_index`` int32 ``[n]``, ``offsets`` int32
``[n, q, 2]``, ``max_context`` bool ``[n, q]``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from heads_jax.data.encoding import template_segments
from heads_jax.errors import UserError

MAX_SEQ_LENGTH = 384   # run_squad.py defaults (Devlin et al.'s SQuAD setting)
DOC_STRIDE = 128
MAX_QUERY_LENGTH = 64
VERSIONS = ("v1", "v2")
_LAYOUT = ("{'version', 'data': [{'title', 'paragraphs': [{'context', 'qas': [{'id', 'question', "
           "'answers': [{'text', 'answer_start'}]}]}]}]} as the official train/dev files")


@dataclasses.dataclass(frozen=True)
class Answer:
  text: str
  start: int   # character offset in the context


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """One question on one context. ``answers`` empty and ``is_impossible`` for a v2.0
  unanswerable question. Read as a text pair (``text_a`` question, ``text_b`` context) by the
  analysis (``heads_jax.data.specs``)."""
  qid: str
  question: str
  context: str
  answers: tuple[Answer, ...]
  title: str = ""
  is_impossible: bool = False

  @property
  def text_a(self) -> str:
    return self.question

  @property
  def text_b(self) -> str:
    return self.context

  @property
  def label(self):
    return None


def _version_of(arg: str | None, default: str) -> str:
  if arg is None:
    return default
  v = {"v1": "v1", "v1.1": "v1", "1.1": "v1", "v2": "v2", "v2.0": "v2", "2.0": "v2"}.get(str(arg))
  if v is None:
    raise UserError(f"SQuAD version {arg!r} is not one of v1 (v1.1), v2 (v2.0)")
  return v


def _checked_answers(where: str, qid: str, context: str, answers) -> tuple[Answer, ...]:
  out = []
  for a in answers:
    text, start = str(a["text"]), a["answer_start"]
    try:
      start = int(start)
      if isinstance(a["answer_start"], (bool, float)) and start != a["answer_start"]:
        raise ValueError
    except (TypeError, ValueError):
      raise UserError(f"{where}: question {qid}: answer {text!r} has answer_start "
                      f"{a['answer_start']!r}, not a character offset (a whole number); fix the "
                      f"file") from None
    if context[start:start + len(text)] != text:
      raise UserError(f"{where}: question {qid}: answer {text!r} does not match the context at its "
                      f"answer_start {start} (the context has {context[start:start + len(text)]!r} "
                      f"there); fix the offset or the text")
    out.append(Answer(text, start))
  return tuple(out)


def _keep(examples: list[SquadExample], version: str, max_examples: int | None, where,
          report: dict | None = None):
  if version == "v1":
    kept = [e for e in examples if not e.is_impossible]
    if not kept:
      raise UserError(f"{where}: all {len(examples)} questions are unanswerable (SQuAD v2.0 "
                      f"is_impossible) and v1 keeps only answerable ones: read it as v2 "
                      f"(squad:FILE:v2, squad.version=v2)")
    if report is not None:
      report["unanswerable_dropped"] = len(examples) - len(kept)
    examples = kept
  return examples if max_examples is None else examples[:max_examples]


def read_squad_json(path, version: str | None = None,
                    max_examples: int | None = None, *, report: dict | None = None) -> list[SquadExample]:
  """The questions of an official SQuAD JSON file (v1.1 or v2.0 layout), in file order (see the
  module docstring for ``version``). Read as v1, a file of unanswerable questions only is a
  ``UserError`` saying so; ``report`` (a dict) gets ``unanswerable_dropped``, how many v1 left
  out."""
  path = Path(path)
  try:
    with open(path, encoding="utf-8") as f:
      doc = json.load(f)
  except FileNotFoundError:
    raise UserError(f"SQuAD file {path} does not exist") from None
  except UnicodeDecodeError:
    from heads_jax.data.utf8 import not_utf8
    raise not_utf8(path) from None
  except json.JSONDecodeError as e:
    raise UserError(f"{path} is not SQuAD JSON (not JSON: {e.msg} at line {e.lineno}); expected "
                    f"{_LAYOUT}") from None
  if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
    raise UserError(f"{path} is not SQuAD JSON (no 'data' list); expected {_LAYOUT}")
  file_version = "v2" if str(doc.get("version", "")).lstrip("v").startswith("2") else "v1"
  examples = []
  try:
    for article in doc["data"]:
      title = article.get("title", "")
      for para in article["paragraphs"]:
        context = para["context"]
        for qa in para["qas"]:
          impossible = bool(qa.get("is_impossible", False))
          answers = () if impossible else _checked_answers(str(path), qa["id"], context,
                                                           qa["answers"])
          if not impossible and not answers:
            raise UserError(f"{path}: question {qa['id']} has no answers and is not marked "
                            f"is_impossible (a v2.0 unanswerable question); fix the file")
          examples.append(SquadExample(str(qa["id"]), qa["question"], context, answers, title,
                                       impossible))
  except (KeyError, TypeError, AttributeError) as e:
    raise UserError(f"{path} is not SQuAD JSON (missing or malformed {e}); expected "
                    f"{_LAYOUT}") from None
  if not examples:
    raise UserError(f"{path} holds no questions; expected {_LAYOUT}")
  return _keep(examples, _version_of(version, file_version), max_examples, path, report)


def _as_str(value) -> str:
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def squad_example_from_record(record: dict, where: str = "TFDS squad") -> SquadExample:
  """One TFDS ``squad`` record (``id``, ``title``, ``context``, ``question``, ``answers``
  ``{text: [...], answer_start: [...]}``, v2.0 also ``is_impossible``) as a ``SquadExample``."""
  qid, context = _as_str(record["id"]), _as_str(record["context"])
  ans = record["answers"]
  answers = [{"text": _as_str(t), "answer_start": int(s)}
             for t, s in zip(list(ans["text"]), list(ans["answer_start"]))]
  impossible = bool(record.get("is_impossible", False))
  return SquadExample(qid, _as_str(record["question"]), context,
                      () if impossible else _checked_answers(where, qid, context, answers),
                      _as_str(record.get("title", "")), impossible)


def read_squad_tfds(config: str = "v1.1", split: str = "validation", data_dir=None,
                    max_examples: int | None = None) -> list[SquadExample]:
  """Reads TFDS ``squad/<config>`` (``v1.1`` or ``v2.0``) through ``tfds.data_source``
  (array_record, no TensorFlow); the dataset must already be prepared."""
  version = _version_of(config, "v1")
  config = {"v1": "v1.1", "v2": "v2.0"}[version]
  import tensorflow_datasets as tfds  # optional heavy dependency, only for TFDS data
  split = {"dev": "validation"}.get(split, split)
  try:
    source = tfds.data_source(f"squad/{config}", split=split, data_dir=data_dir, download=False)
  except Exception as e:  # TFDS raises assorted errors for a missing / unprepared dataset
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
    raise UserError(
        f"cannot read TFDS squad/{config} split {split!r} from {data_dir or 'the TFDS default data folder'} "
        f"({first_line}); prepare it first (tfds build squad/{config} --file_format=array_record) "
        f"or read the official JSON (squad:FILE)") from None
  n = len(source) if max_examples is None else min(len(source), max_examples)
  where = f"TFDS squad/{config} {split}"
  return [squad_example_from_record(source[i], where) for i in range(n)]


def sample_examples(examples: list, n: int | None, seed: int = 0) -> list:
  """``n`` examples drawn without replacement with ``seed`` (all when ``n`` is None or not
  smaller), kept in their original order (Guan et al. average over 1,000 random SQuAD samples)."""
  if n is None or n >= len(examples):
    return list(examples)
  pick = np.sort(np.random.default_rng(seed).choice(len(examples), size=n, replace=False))
  return [examples[i] for i in pick]


def split_by_title(examples: list[SquadExample], eval_titles) -> tuple[list, list]:
  """``(rest, held out)``: the questions of the articles ``eval_titles`` held out (whole
  articles, so that no paragraph is in both)."""
  titles = {t.strip() for t in eval_titles if t.strip()}
  known = {e.title for e in examples}
  unknown = sorted(titles - known)
  if unknown:
    raise UserError(f"no SQuAD article titled {unknown[0]!r}; titles here: {', '.join(sorted(known))}")
  return ([e for e in examples if e.title not in titles], [e for e in examples if e.title in titles])


# -------------------------------------------------------------------------------------------------
# Features


@dataclasses.dataclass
class SquadFeatures:
  """The windows of a list of examples (arrays in the module docstring)."""
  examples: list[SquadExample]
  input_ids: np.ndarray
  attention_mask: np.ndarray
  token_type_ids: np.ndarray
  start_positions: np.ndarray
  end_positions: np.ndarray
  example_index: np.ndarray
  offsets: np.ndarray
  max_context: np.ndarray

  def __len__(self) -> int:
    return len(self.example_index)

  def arrays(self) -> dict:
    """The model inputs and span labels, ``{name: array [n, ...]}``."""
    return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids, "start_positions": self.start_positions,
            "end_positions": self.end_positions}


def pair_template(tokenizer) -> tuple[list[int], list[int], list[int]]:
  """The tokenizer's special pieces before, between and after a pair: BERT ``[CLS]`` / ``[SEP]``
  / ``[SEP]``, RoBERTa ``<s>`` / ``</s></s>`` / ``</s>``."""
  enc = tokenizer("a", "b", truncation=True, max_length=64)
  ids, seq = enc["input_ids"], enc.sequence_ids()
  first = [i for i, s in enumerate(seq) if s == 0]
  second = [i for i, s in enumerate(seq) if s == 1]
  if not first or not second:
    raise ValueError("the tokenizer encodes no pair template (question, context)")
  return ids[:first[0]], ids[first[-1] + 1:second[0]], ids[second[-1] + 1:]


def doc_windows(n: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
  """``(start, length)`` of each window over ``n`` context pieces (run_squad.py's doc spans)."""
  spans, start = [], 0
  while start < n:
    length = min(n - start, max_tokens)
    spans.append((start, length))
    if start + length == n:
      break
    start += min(length, stride)
  return spans


def is_max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
  """run_squad.py's ``_check_is_max_context``: is window ``index`` the one in which piece
  ``position`` has the most context (``min(left, right) + 0.01 * length``; first wins ties)?"""
  best_score, best = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best = score, i
  return index == best


def answer_pieces(offsets: np.ndarray, start: int, end: int) -> tuple[int, int] | None:
  """The first and last piece (of a context's ``offsets [t, 2]``) overlapping the characters
  ``[start, end)``, or None if no piece does."""
  hit = np.flatnonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))
  if not hit.size:
    return None
  return int(hit[0]), int(hit[-1])


def build_features(examples: list[SquadExample], tokenizer, *, max_seq_length: int = MAX_SEQ_LENGTH,
                   doc_stride: int = DOC_STRIDE, max_query_length: int = MAX_QUERY_LENGTH,
                   progress=None) -> SquadFeatures:
  """The windows of ``examples`` (module docstring). A question that leaves no room for the
  context in ``max_seq_length`` is refused (``UserError``)."""
  if doc_stride < 1 or max_query_length < 1:
    raise UserError(f"doc_stride ({doc_stride}) and max_query_length ({max_query_length}) must "
                    f"be >= 1")
  prefix, middle, suffix = pair_template(tokenizer)
  n_special = len(prefix) + len(middle) + len(suffix)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  questions = tokenizer([e.question for e in examples], add_special_tokens=False, truncation=True,
                        max_length=max_query_length)["input_ids"]
  contexts = list(dict.fromkeys(e.context for e in examples))
  enc = tokenizer(contexts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
  ctx = {c: (np.asarray(ids, np.int32), np.asarray(off, np.int32).reshape(-1, 2))
         for c, ids, off in zip(contexts, enc["input_ids"], enc["offset_mapping"])}
  rows = {k: [] for k in ("input_ids", "token_type_ids", "start", "end", "example", "offsets",
                          "max_context", "length")}
  for ei, ex in enumerate(examples):
    q = list(questions[ei])
    room = max_seq_length - len(q) - n_special
    if room < 1:
      raise UserError(
          f"question {ex.qid} has {len(q)} pieces (at most max_query_length {max_query_length} "
          f"kept) and leaves no room for its context in a window of max_seq_length "
          f"{max_seq_length} ({n_special} special tokens): raise max_seq_length or lower "
          f"max_query_length")
    ids, offs = ctx[ex.context]
    spans = doc_windows(len(ids), room, doc_stride)
    answer = None
    if ex.answers:
      a = ex.answers[0]
      answer = answer_pieces(offs, a.start, a.start + len(a.text))
    c0 = len(prefix) + len(q) + len(middle)  # position of the first context piece
    for wi, (start, length) in enumerate(spans):
      seq_ids = prefix + q + middle + ids[start:start + length].tolist() + suffix
      seq = ([None] * len(prefix) + [0] * len(q) + [None] * len(middle) + [1] * length
             + [None] * len(suffix))
      k = len(seq_ids)
      off = np.full((max_seq_length, 2), -1, np.int32)
      off[c0:c0 + length] = offs[start:start + length]
      mc = np.zeros(max_seq_length, bool)
      mc[c0:c0 + length] = [is_max_context(spans, wi, start + j) for j in range(length)]
      s = e = 0
      if answer is not None and start <= answer[0] and answer[1] < start + length:
        s, e = c0 + answer[0] - start, c0 + answer[1] - start
      row = np.full(max_seq_length, pad, np.int32)
      row[:k] = seq_ids
      types = np.zeros(max_seq_length, np.int32)
      types[:k] = template_segments(seq, True)
      rows["input_ids"].append(row)
      rows["token_type_ids"].append(types)
      rows["start"].append(s)
      rows["end"].append(e)
      rows["example"].append(ei)
      rows["length"].append(k)
      rows["offsets"].append(off)
      rows["max_context"].append(mc)
    if progress is not None:
      progress(ei + 1, len(examples))
  if not rows["example"]:
    raise UserError("no SQuAD windows: every context is empty")
  input_ids = np.stack(rows["input_ids"])
  mask = (np.arange(max_seq_length)[None] < np.asarray(rows["length"])[:, None]).astype(np.int32)
  return SquadFeatures(examples, input_ids, mask, np.stack(rows["token_type_ids"]) * mask,
                       np.asarray(rows["start"], np.int32), np.asarray(rows["end"], np.int32),
                       np.asarray(rows["example"], np.int32), np.stack(rows["offsets"]),
                       np.stack(rows["max_context"]))
