"""Official SQuAD EM/F1 on values worked out by hand, and n-best answer extraction over windows
(run_squad.py's rules) on hand-made logits."""

import json

import numpy as np
import pytest

from heads_jax.data import squad as sq
from heads_jax.data import squad_eval as ev


def test_normalisation():
  assert ev.normalize_answer("The  Cat's hat!") == "cats hat"
  assert ev.normalize_answer("an apple a day, The END.") == "apple day end"
  assert ev.normalize_answer("theory  (a) ") == "theory"       # "a" alone is an article
  assert ev.normalize_answer("Anthem") == "anthem"               # articles only as whole words


def test_f1_and_exact_match_by_hand():
  assert ev.f1_score("the cat sat on the mat", "a cat sat on a mat") == 1.0   # both "cat sat on mat"
  assert ev.f1_score("cat sat", "cat sat on mat") == pytest.approx(2 / 3)      # P 1, R 1/2
  assert ev.f1_score("mat mat", "mat") == pytest.approx(2 / 3)                 # P 1/2, R 1
  assert ev.f1_score("dog", "cat") == 0.0
  assert ev.exact_match("The Denver Broncos!", "denver broncos") == 1.0
  assert ev.exact_match("Denver", "denver broncos") == 0.0


def test_scores_max_over_references_and_missing():
  refs = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Paris"], "q3": ["x y z"]}
  preds = {"q1": "denver broncos!", "q2": "in Paris France"}
  s = ev.squad_scores(refs, preds)
  # q1: EM 1, F1 1; q2: EM 0, F1 2*(1/3)*1/(1/3+1) = 0.5; q3: no prediction, 0
  assert s["exact_match"] == pytest.approx(100 / 3) and s["f1"] == pytest.approx(50.0)
  assert (s["total"], s["missing"]) == (3, 1)
  # the best reference counts: "Paris France" vs ["Paris", "Paris France"] is exact
  assert ev.squad_scores({"q": ["Paris", "Paris France"]}, {"q": "paris, france"})["exact_match"] == 100.0
  # SQuAD 2.0 unanswerable: right only when the prediction is empty
  assert ev.squad_scores({"q": []}, {"q": ""}) == {"exact_match": 100.0, "f1": 100.0, "total": 1, "missing": 0}
  assert ev.squad_scores({"q": []}, {"q": "France"})["f1"] == 0.0


CTX = "aa bb cc dd ee ff"   # pieces at characters 0, 3, 6, 9, 12, 15


def _features(windows, k=8):
  """One example over ``windows``: each ``(first piece, n pieces, max-context flags)``, the
  pieces at positions 2.. (0: start token, 1: question)."""
  ex = sq.SquadExample("q", "?", CTX, (sq.Answer("cc", 6),))
  n = len(windows)
  offsets = np.full((n, k, 2), -1, np.int32)
  mc = np.zeros((n, k), bool)
  for i, (first, count, flags) in enumerate(windows):
    for j in range(count):
      offsets[i, 2 + j] = (3 * (first + j), 3 * (first + j) + 2)
      mc[i, 2 + j] = flags[j]
  z = np.zeros((n, k), np.int32)
  return sq.SquadFeatures([ex], z, z, z, z[:, 0], z[:, 0], np.zeros(n, np.int32), offsets, mc)


def test_predicted_span_follows_the_reference_rules():
  f = _features([(0, 4, [1, 1, 1, 0]), (2, 4, [0, 1, 1, 1])])
  start = np.full((2, 8), -5.0)
  end = np.full((2, 8), -5.0)
  start[0, 0] = end[0, 0] = 9.0     # the start token: not a context piece, never an answer
  start[0, 1] = 8.0                 # the question: never
  start[0, 5], end[0, 5] = 7.0, 7.0  # "dd" in window 0, where it lacks max context: skipped
  start[1, 3], end[1, 4] = 3.0, 3.0  # window 1: "dd ee" (pieces 3..4), score 6
  start[1, 5], end[1, 2] = 4.0, 4.0  # end before start (with start[1, 3]: score 7): skipped
  preds = ev.predict_answers(f, start, end)
  assert preds == {"q": "dd ee"}
  # with the maximum answer length 1, window 1's best valid span is one piece
  assert ev.predict_answers(f, start, end, max_answer_length=1)["q"] in {"aa", "bb", "cc", "dd", "ee", "ff"}
  cands = ev.window_candidates(start[1], end[1], f.offsets[1], f.max_context[1], max_answer_length=30)
  assert cands[0] == (6.0, 3, 4)
  assert all(s <= e and f.max_context[1, s] for _, s, e in cands)


def test_n_best_limits_the_candidates():
  f = _features([(0, 6, [1] * 6)])
  start = np.array([[0, 0, 1, 2, 3, 4, 5, 6]], float)
  end = np.array([[0, 0, 6, 5, 4, 3, 2, 1]], float)
  # n_best 2: starts {7, 6} and ends {2, 3}: every pair has end < start, so no answer
  assert ev.predict_answers(f, start, end, n_best_size=2) == {"q": ""}
  assert ev.predict_answers(f, start, end, n_best_size=8)["q"] != ""


def test_version_2_null_answer():
  f = _features([(0, 4, [1, 1, 1, 1])])
  start = np.zeros((1, 8))
  end = np.zeros((1, 8))
  start[0, 2], end[0, 3] = 2.0, 2.0            # best span "aa bb", score 4
  start[0, 0], end[0, 0] = 2.5, 2.0            # null score 4.5
  assert ev.predict_answers(f, start, end)["q"] == "aa bb"                          # v1: no null
  assert ev.predict_answers(f, start, end, version_2=True)["q"] == ""              # 4.5 - 4 > 0
  assert ev.predict_answers(f, start, end, version_2=True,
                            null_score_diff_threshold=1.0)["q"] == "aa bb"


def test_write_evaluation(tmp_path):
  out = ev.write_evaluation(tmp_path / "e", {"q1": "Café"}, {"exact_match": 50.0, "f1": 60.0})
  assert json.loads((out / "predictions.json").read_text(encoding="utf-8")) == {"q1": "Café"}
  assert json.loads((out / "eval.json").read_text())["f1"] == 60.0
