"""Pruning curves (Michel et al.) on hand-built importances: the order is pinned, not recomputed.

A fake evaluator (a pure function of the head gate) and a fake importance estimator replace the
model, so every pruned set and every metric along the curves is written out by hand here; no
value is derived with ``pruning.importance_order``, the function the code under test uses.
"""

import numpy as np
import pandas as pd
import pytest

from heads_jax.ablation import pruning

L, H = 2, 3

# Importance of the full model: least important first is
# (1,1) 0.05, (0,1) 0.1, (1,0) 0.3, (0,0) 0.3 is a tie with (1,0) -> layer 0 first, ...
IMPORTANCE = np.array([[0.3, 0.1, 0.9],
                       [0.3, 0.05, 0.7]])
# least important first; the tie (0,0) / (1,0) at 0.3 goes to the lower layer
ORDER_ONCE = [(1, 1), (0, 1), (0, 0), (1, 0), (1, 2), (0, 2)]

# The loss grows by DAMAGE[l, h] for each pruned head (a pure function of the gate).
DAMAGE = np.array([[0.04, 0.02, 0.32],
                   [0.08, 0.01, 0.16]])


class FakeEvaluator:
  """``evaluate(gate)``: loss 0.5 + the summed damage of the heads with gate 0; accuracy
  0.9 - loss / 10; f1 0.8 - loss / 20. Records every call."""
  num_layers, num_heads = L, H

  def __init__(self):
    self.calls = []

  def evaluate(self, head_gate=None, *, gate_mode="remove"):
    gate = np.ones((L, H)) if head_gate is None else np.asarray(head_gate)
    assert gate.shape == (L, H)
    self.calls.append((gate.copy(), gate_mode))
    return metrics_of(gate == 0)


def metrics_of(pruned_mask):
  loss = 0.5 + float(DAMAGE[pruned_mask].sum())
  return {"accuracy": 0.9 - loss / 10, "f1": 0.8 - loss / 20, "loss": loss}


def mask_of(heads):
  m = np.zeros((L, H), bool)
  for l, h in heads:
    m[l, h] = True
  return m


class FakeEstimator:
  """The importance under a gate: IMPORTANCE, except that once head (1,1) is pruned, head
  (1,2) becomes the least important (0.01), and pruned heads report 0 (as a gradient at gate 0
  may). Records the gates it was asked about."""

  def __init__(self):
    self.gates = []

  def __call__(self, head_gate=None):
    gate = np.ones((L, H)) if head_gate is None else np.asarray(head_gate)
    self.gates.append(gate.copy())
    imp = IMPORTANCE.copy()
    if gate[1, 1] == 0:
      imp[1, 2] = 0.01
    return np.where(gate == 0, 0.0, imp)


def _rows(curve, method, seed=None):
  rows = curve[curve["method"] == method]
  if seed is not None:
    rows = rows[rows["seed"] == seed]
  return rows.sort_values("step").reset_index(drop=True)


def _pruned(row):
  return [tuple(int(x) for x in p.split(":")) for p in row["pruned"].split(",")] if row["pruned"] else []


def test_importance_order_least_important_first():
  assert pruning.importance_order(IMPORTANCE, np.zeros((L, H), bool)) == ORDER_ONCE
  # pruned heads are left out, the rest keeps its order
  assert pruning.importance_order(IMPORTANCE, mask_of([(1, 1), (0, 2)])) == [
      (0, 1), (0, 0), (1, 0), (1, 2)]
  # negative and equal importances: ascending, ties by layer then head
  imp = np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 2.0]])
  assert pruning.importance_order(imp, np.zeros((L, H), bool)) == [
      (0, 1), (1, 0), (0, 0), (0, 2), (1, 1), (1, 2)]


def test_pruning_counts_hand_values():
  assert pruning.pruning_counts(6, 1 / 6) == [0, 1, 2, 3, 4, 5, 6]
  assert pruning.pruning_counts(6, 0.25) == [0, 2, 3, 4, 6]        # round(1.5) = 2, round(4.5) = 4
  assert pruning.pruning_counts(6, 0.5, max_share=0.5) == [0, 3]
  assert pruning.pruning_counts(6, 1.0) == [0, 6]                  # a step of 1 is allowed
  assert pruning.pruning_counts(10) == list(range(11))             # default: 10% steps to 100%
  assert pruning.pruning_counts(144, 0.05, 0.5) == [round(i * 7.2) for i in range(11)]
  for bad in (0.0, -0.1, 1.5):
    with pytest.raises(Exception, match="share"):
      pruning.pruning_counts(6, bad)
  for bad in (0.0, 1.5):
    with pytest.raises(Exception, match="largest pruned share"):
      pruning.pruning_counts(6, 0.1, max_share=bad)


def test_importance_curve_prunes_least_important_first_once():
  ev = FakeEvaluator()
  curve = pruning.pruning_curve(ev, FakeEstimator(), step=1 / 6, reestimate=False,
                                random_seeds=0, gate_mode="uniform")
  rows = _rows(curve, "importance")
  assert list(rows["num_pruned"]) == [0, 1, 2, 3, 4, 5, 6]
  assert list(rows["seed"]) == [-1] * 7
  np.testing.assert_allclose(rows["share_pruned"], np.arange(7) / 6)
  for i, row in rows.iterrows():
    assert _pruned(row) == ORDER_ONCE[:i], i           # in pruning order, the prefix of the order
    want = metrics_of(mask_of(ORDER_ONCE[:i]))
    for m in ("accuracy", "f1", "loss"):
      assert row[m] == pytest.approx(want[m]), (i, m)
  # loss by hand: 0.5, +0.01 (1,1), +0.02 (0,1), +0.04 (0,0), +0.08 (1,0), +0.16, +0.32
  np.testing.assert_allclose(rows["loss"], [0.5, 0.51, 0.53, 0.57, 0.65, 0.81, 1.13])
  assert all(mode == "uniform" for _, mode in ev.calls)


def test_importance_curve_reestimates_on_the_pruned_model():
  ev, est = FakeEvaluator(), FakeEstimator()
  curve = pruning.pruning_curve(ev, est, step=1 / 6, reestimate=True, random_seeds=0)
  rows = _rows(curve, "importance")
  # (1,1) first; then (1,2) has become the least important (0.01); then the once-order.
  want = [(1, 1), (1, 2), (0, 1), (0, 0), (1, 0), (0, 2)]
  for i, row in rows.iterrows():
    assert _pruned(row) == want[:i], i
    assert row["loss"] == pytest.approx(metrics_of(mask_of(want[:i]))["loss"])
  # the estimator saw the gate of the model pruned so far (1 = kept) before each step
  assert len(est.gates) == 6
  for i, gate in enumerate(est.gates):
    np.testing.assert_array_equal(gate, (~mask_of(want[:i])).astype(np.float32))
  # without re-estimation the changed importance is never seen: (1,2) goes fifth
  once = _rows(pruning.pruning_curve(FakeEvaluator(), FakeEstimator(), step=1 / 6,
                                     reestimate=False, random_seeds=0), "importance")
  assert _pruned(once.iloc[2]) == [(1, 1), (0, 1)]


def test_coarse_steps_take_several_heads_at_once():
  curve = pruning.pruning_curve(FakeEvaluator(), FakeEstimator(), step=0.5, reestimate=True,
                                random_seeds=0)
  rows = _rows(curve, "importance")
  assert list(rows["num_pruned"]) == [0, 3, 6]
  # one estimate at the full gate gives the three least important: (1,1), (0,1), (0,0)
  assert set(_pruned(rows.iloc[1])) == {(1, 1), (0, 1), (0, 0)}
  assert rows.iloc[1]["loss"] == pytest.approx(0.57)
  assert rows.iloc[2]["loss"] == pytest.approx(1.13)
  half = pruning.pruning_curve(FakeEvaluator(), FakeEstimator(), step=0.25, max_share=0.5,
                               random_seeds=0)
  assert list(_rows(half, "importance")["num_pruned"]) == [0, 2, 3]


def test_random_curves_are_evaluated_nested_and_seeded():
  ev = FakeEvaluator()
  curve = pruning.pruning_curve(ev, None, step=1 / 6, random_seeds=3, seed=7)
  assert set(curve["method"]) == {"random"}
  assert sorted(curve["seed"].unique()) == [7, 8, 9]
  orders = {}
  for s in (7, 8, 9):
    rows = _rows(curve, "random", s)
    assert list(rows["num_pruned"]) == [0, 1, 2, 3, 4, 5, 6]
    sets = [set(_pruned(r)) for _, r in rows.iterrows()]
    assert all(len(a) == i for i, a in enumerate(sets))
    assert all(a < b for a, b in zip(sets, sets[1:]))               # nested, one head per step
    assert sets[-1] == {(l, h) for l in range(L) for h in range(H)}
    for i, row in rows.iterrows():                                  # each point is an evaluation
      want = metrics_of(mask_of(sets[i]))
      assert (row["accuracy"], row["f1"]) == pytest.approx((want["accuracy"], want["f1"]))
      assert row["loss"] == pytest.approx(want["loss"])
    orders[s] = [next(iter(b - a)) for a, b in zip(sets, sets[1:])]
    # the documented seeds: the order of default_rng(seed) over the flat (layer, head) index
    perm = np.random.default_rng(s).permutation(L * H)
    assert orders[s] == [(int(j) // H, int(j) % H) for j in perm]
  assert len({tuple(o) for o in orders.values()}) == 3               # the seeds differ
  # the unpruned point is evaluated once (the baseline), not once per seed
  assert sum(bool((g == 1).all()) for g, _ in ev.calls) == 1


def test_curve_summary_every_step():
  curve = pruning.pruning_curve(FakeEvaluator(), FakeEstimator(), step=1 / 6, reestimate=False,
                                random_seeds=3, seed=0)
  summary = pruning.curve_summary(curve)
  assert list(summary.columns) == [
      "step", "share_pruned", "num_pruned", "accuracy_importance", "accuracy_random",
      "accuracy_random_std", "f1_importance", "f1_random", "f1_random_std"]
  assert list(summary.index) == list(range(7))
  assert list(summary["num_pruned"]) == [0, 1, 2, 3, 4, 5, 6]
  imp = _rows(curve, "importance")
  for i in range(7):
    rnd = curve[(curve["method"] == "random") & (curve["step"] == i)]
    for m in ("accuracy", "f1"):
      assert summary.loc[i, f"{m}_importance"] == pytest.approx(imp.loc[i, m])
      vals = rnd[m].to_numpy()
      assert len(vals) == 3
      assert summary.loc[i, f"{m}_random"] == pytest.approx(vals.sum() / 3)
      assert summary.loc[i, f"{m}_random_std"] == pytest.approx(
          np.sqrt(((vals - vals.sum() / 3) ** 2).sum() / 3), abs=1e-12)
  # at share 0 and 1 every curve is the same model: no spread
  assert summary.loc[0, "accuracy_random_std"] == 0 and summary.loc[6, "accuracy_random_std"] == 0
  # in between, pruning the least important heads hurts less than pruning at random on this
  # fake (the damage grows with the importance)
  mid = summary.loc[1:5]
  assert (mid["accuracy_importance"] >= mid["accuracy_random"] - 1e-12).all()
  assert "loss_importance" not in summary.columns
  with_loss = pruning.curve_summary(curve, metrics=("loss",))
  assert with_loss.loc[3, "loss_importance"] == pytest.approx(0.57)
  # only one method: only its columns
  only_random = pruning.curve_summary(curve[curve["method"] == "random"])
  assert "accuracy_importance" not in only_random.columns
  assert isinstance(only_random, pd.DataFrame) and len(only_random) == 7


def test_defaults_reestimate_with_three_random_seeds():
  """The defaults a caller gets: re-estimation (Michel et al.), 3 random orders from seed 0,
  10% steps."""
  est = FakeEstimator()
  curve = pruning.pruning_curve(FakeEvaluator(), est)
  assert sorted(curve[curve["method"] == "random"]["seed"].unique()) == [0, 1, 2]
  rows = _rows(curve, "importance")
  assert list(rows["num_pruned"]) == [0, 1, 2, 3, 4, 5, 6]   # round(0.6 i), repeats dropped
  assert _pruned(rows.iloc[2]) == [(1, 1), (1, 2)]           # re-estimated after the first head
  assert len(est.gates) == 6                            # once per new head, not per step
