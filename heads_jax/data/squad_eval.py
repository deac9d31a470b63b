"""SQuAD answers from span logits, and the official exact match / F1 (no jax).

* ``predict_answers``: BERT's reference ``write_predictions``: for every window of a question,
  the ``n_best_size`` (20) highest start and end logits; a pair ``(s, e)`` is a candidate if both
  are context pieces, ``s`` has its maximum context in this window, ``s <= e`` and
  ``e - s + 1 <= max_answer_length`` (30); the candidate with the highest ``start + end`` logit
  over all windows wins, and its text is the context's characters from the start of piece ``s``
  to the end of piece ``e`` (the pieces' offsets replace the reference's ``get_final_text``).
  SQuAD 2.0 (``version_2``): the null score is the smallest ``start[0] + end[0]`` over the
  windows (position 0 is the start token), and the answer is "" when it exceeds the best span's
  score by more than ``null_score_diff_threshold`` (0.0), as the reference.
* ``squad_scores``: the official SQuAD v1.1 ``evaluate-v1.1.py``: answers normalised (lower
  case, punctuation removed, the articles a/an/the removed, whitespace collapsed), exact match
  and token F1 taking the maximum over the reference answers, averaged over every question and
  given in percent; a question without a prediction scores 0. A question without reference
  answers (SQuAD 2.0 unanswerable) scores 1 exactly when the prediction normalises to "", as
  ``evaluate-v2.0.py``.
* ``write_evaluation``: ``predictions.json`` (question id -> answer text, the official format)
  beside ``eval.json`` (the scores).
"""

from __future__ import annotations

import collections
import json
import re
import string
from pathlib import Path

import numpy as np

N_BEST_SIZE = 20
MAX_ANSWER_LENGTH = 30

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
  """Lower case, punctuation removed, articles removed, whitespace collapsed (official script)."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def exact_match(prediction: str, truth: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
  """Token F1 of the normalised answers (two empty answers: 1, one empty: 0)."""
  pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
  if not pred or not gold:
    return float(pred == gold)
  same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(gold)
  return 2 * precision * recall / (precision + recall)


def squad_scores(references: dict[str, list[str]], predictions: dict[str, str]) -> dict:
  """``{"exact_match", "f1"}`` in percent over every question of ``references`` (question id ->
  reference answer texts; empty for an unanswerable question), plus ``total`` and ``missing``
  (questions without a prediction, scored 0)."""
  em = f1 = 0.0
  missing = 0
  for qid, truths in references.items():
    if qid not in predictions:
      missing += 1
      continue
    pred = predictions[qid]
    truths = list(truths) or [""]
    em += max(exact_match(pred, t) for t in truths)
    f1 += max(f1_score(pred, t) for t in truths)
  n = len(references)
  return {"exact_match": 100.0 * em / n if n else float("nan"),
          "f1": 100.0 * f1 / n if n else float("nan"), "total": n, "missing": missing}


def references_of(examples) -> dict[str, list[str]]:
  """Question id -> reference answer texts of ``SquadExample``s."""
  return {e.qid: [a.text for a in e.answers] for e in examples}


def _top(x: np.ndarray, n: int) -> np.ndarray:
  order = np.argsort(-x, kind="stable")
  return order[:n]


def window_candidates(start_logits, end_logits, offsets, max_context, *,
                      n_best_size: int = N_BEST_SIZE,
                      max_answer_length: int = MAX_ANSWER_LENGTH) -> list[tuple[float, int, int]]:
  """``(score, s, e)`` of the valid spans of one window (module docstring), best first.
  ``start_logits``, ``end_logits`` ``[q]``, ``offsets`` ``[q, 2]`` (-1 outside the context),
  ``max_context`` ``[q]``."""
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  in_context = np.asarray(offsets)[:, 0] >= 0
  out = []
  for s in _top(start_logits, n_best_size):
    if not in_context[s] or not max_context[s]:
      continue
    for e in _top(end_logits, n_best_size):
      if not in_context[e] or e < s or e - s + 1 > max_answer_length:
        continue
      out.append((float(start_logits[s] + end_logits[e]), int(s), int(e)))
  out.sort(key=lambda c: -c[0])
  return out


def predict_answers(features, start_logits, end_logits, *, n_best_size: int = N_BEST_SIZE,
                    max_answer_length: int = MAX_ANSWER_LENGTH, version_2: bool = False,
                    null_score_diff_threshold: float = 0.0) -> dict[str, str]:
  """Question id -> answer text for every example of ``features`` (a
  ``heads_jax.data.squad.SquadFeatures``) from the logits ``[n, q]`` of its windows (module
  docstring). A question with no valid span gets ""."""
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  best: dict[int, tuple[float, int, int, int]] = {}
  null: dict[int, float] = {}
  for i, ei in enumerate(np.asarray(features.example_index).tolist()):
    cands = window_candidates(start_logits[i], end_logits[i], features.offsets[i],
                              features.max_context[i], n_best_size=n_best_size,
                              max_answer_length=max_answer_length)
    if cands and (ei not in best or cands[0][0] > best[ei][0]):
      best[ei] = (cands[0][0], i, cands[0][1], cands[0][2])
    score0 = float(start_logits[i, 0] + end_logits[i, 0])
    null[ei] = min(null.get(ei, np.inf), score0)
  out = {}
  for ei, ex in enumerate(features.examples):
    text = ""
    if ei in best:
      score, i, s, e = best[ei]
      text = ex.context[features.offsets[i, s, 0]:features.offsets[i, e, 1]]
      if version_2 and null.get(ei, -np.inf) - score > null_score_diff_threshold:
        text = ""
    out[ex.qid] = text
  return out


def write_evaluation(out_dir, predictions: dict[str, str], scores: dict) -> Path:
  """Writes ``predictions.json`` (official format) and ``eval.json`` (the scores) to ``out_dir``;
  returns the folder."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "predictions.json").write_text(json.dumps(predictions, indent=1, ensure_ascii=False))
  (out / "eval.json").write_text(json.dumps(scores, indent=2))
  return out
