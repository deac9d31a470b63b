"""One random baseline for every group ablation (issue 43 item 5): random groups with the group's
number of heads in each of its layers (`causal.matched_random_groups`), in the group table, the
intra/inter table and the causal test alike; none (empty, "n/a") for a group of whole layers; the
console line in percent and points. Values derived by hand on a fake evaluator whose metric is a
known sum over the heads removed."""

from __future__ import annotations

import numpy as np
import pytest

from heads_jax.ablation import ablate
from heads_jax.ablation.causal import (causal_tests, layer_counts, matched_random_groups,
                                       whole_layers)
from heads_jax.ablation.groups import HeadGroup
from heads_jax.report import ablation as rep

# The harm of removing each head: 10 points in layer 0, 2 points in layer 1 (2 layers x 3 heads).
HARM = np.array([[0.10, 0.10, 0.10], [0.02, 0.02, 0.02]])
L, H = HARM.shape
BASE = {"accuracy": 0.9, "f1": 0.8, "loss": 0.3}


class _Summed:
  """A fake evaluator: accuracy 0.9 and F1 0.8 minus, loss 0.3 plus, the harm of every head
  removed (gate 0, or any of its attention removed)."""
  num_layers, num_heads, mode = L, H, "remove"

  def __init__(self):
    self.calls = []

  def _metrics(self, removed: np.ndarray) -> dict:
    harm = float((HARM * removed).sum())
    self.calls.append(tuple(zip(*np.nonzero(removed))))
    return {"accuracy": BASE["accuracy"] - harm, "f1": BASE["f1"] - harm,
            "loss": BASE["loss"] + harm}

  def evaluate(self, gate=None, gate_mode="remove", segment_removal=None, renormalise=False):
    if segment_removal is not None:
      return self._metrics(np.asarray(segment_removal).any(-1).astype(float))
    return self._metrics(np.zeros((L, H)) if gate is None else 1.0 - np.asarray(gate))


IN_LAYER_1 = HeadGroup("two of layer 1", "heads", ((1, 0), (1, 1)))
ACROSS = HeadGroup("one of each layer", "heads", ((0, 0), (1, 2)))
LAYER_0 = HeadGroup("layer 0", "layer", ((0, 0), (0, 1), (0, 2)))
EMPTY = HeadGroup("empty", "heads", ())


def test_matched_random_groups_are_of_the_layers_and_share_their_first_draws():
  drawn = matched_random_groups(ACROSS.heads, L, H, 20, seed=4)
  assert len(drawn) == 20 and all(layer_counts(g.heads) == {0: 1, 1: 1} for g in drawn)
  assert [g.heads for g in matched_random_groups(ACROSS.heads, L, H, 3, seed=4)] == \
      [g.heads for g in drawn[:3]]    # the group table's few are the causal test's first
  # the same layer distribution, other heads: the same draws
  assert [g.heads for g in matched_random_groups(((0, 2), (1, 0)), L, H, 20, seed=4)] == \
      [g.heads for g in drawn]
  assert whole_layers(LAYER_0.heads, H) and not whole_layers(IN_LAYER_1.heads, H)
  assert matched_random_groups(LAYER_0.heads, L, H, 5, seed=0) == []
  assert matched_random_groups((), L, H, 5, seed=0) == []


def test_group_table_compares_with_random_heads_of_the_same_layers():
  lines = []
  table = ablate.ablate_groups(_Summed(), [IN_LAYER_1, ACROSS, LAYER_0, EMPTY], random_seeds=3,
                               seed=0, log=lines.append).set_index("group")
  # two heads of layer 1: -4 points; every random pair of layer 1 also -4 (by hand: 2 x 2).
  # Drawn from all heads (the former baseline), most pairs would hold a layer-0 head (-12, -20).
  row = table.loc["two of layer 1"]
  assert row["accuracy_change"] == pytest.approx(-0.04)
  assert row["random_accuracy_change"] == pytest.approx(-0.04)
  assert row["random_accuracy_std"] == pytest.approx(0.0, abs=1e-12)
  assert row["random_loss_change"] == pytest.approx(0.04) and row["random_seeds"] == 3
  # one head of each layer: 10 + 2 = 12 points, and so is every random group of those layers
  assert table.loc["one of each layer", "random_f1_change"] == pytest.approx(-0.12)
  # a whole layer: no other group of its layers; empty random columns, none drawn
  whole = table.loc["layer 0"]
  assert whole["accuracy_change"] == pytest.approx(-0.30)
  assert np.isnan(whole["random_accuracy_change"]) and whole["random_seeds"] == 0
  assert table.loc["empty", "random_seeds"] == 0
  # the console in percent and points
  assert "remove heads 'two of layer 1' (2 heads): accuracy 86.00% (-4.00 pts, random -4.00 pts)" \
      in lines
  assert "remove layer 'layer 0' (3 heads): accuracy 60.00% (-30.00 pts, random n/a (whole " \
         "layers))" in lines


def test_segment_table_has_the_same_baseline():
  ev = _Summed()
  table = ablate.ablate_segments(ev, [ACROSS, LAYER_0], parts=("intra",), random_seeds=2, seed=0)
  rows = table.set_index("group")
  assert rows.loc["one of each layer", "random_accuracy_change"] == pytest.approx(-0.12)
  assert np.isnan(rows.loc["layer 0", "random_accuracy_change"])
  # the random groups it evaluated: one head of layer 0 and one of layer 1 each
  drawn = [c for c in ev.calls if c and set(c) != set(ACROSS.heads) and set(c) != set(LAYER_0.heads)]
  assert drawn and all(sorted(l for l, _ in c) == [0, 1] for c in drawn)


def test_causal_test_draws_the_same_groups_and_skips_whole_layers():
  ev = _Summed()

  class Group:   # causal's interface: evaluate(heads)
    num_layers, num_heads, mode = L, H, "remove"

    def evaluate(self, heads):
      gate = np.ones((L, H))
      for l, h in heads:
        gate[l, h] = 0
      return ev.evaluate(gate)

  table = causal_tests(Group(), [IN_LAYER_1, LAYER_0], random_groups=4, seed=0).set_index("group")
  row = table.loc["two of layer 1"]
  # every random pair of layer 1 harms as much as the group: all 4 tie, rank 5, p = 5 / 5
  assert row["random_mean_change"] == pytest.approx(-0.04) and row["rank"] == 5
  assert row["p_value"] == pytest.approx(1.0) and row["random_groups"] == 4
  whole = table.loc["layer 0"]
  assert whole["change"] == pytest.approx(-0.30) and whole["random_groups"] == 0
  assert np.isnan(whole["p_value"]) and np.isnan(whole["rank"])


def test_report_section_says_the_baseline_and_the_unit():
  table = ablate.ablate_groups(_Summed(), [IN_LAYER_1, LAYER_0], random_seeds=2, seed=0)
  html = rep.ablation_section(table, None, title="Ablation by heads")["html"]
  assert "same number of heads in each layer as the group" in html
  assert "percentage points" in html and rep.WHOLE_LAYERS_NOTE in html
  assert "<th>accuracy change (pts)</th>" in html and "<th>random accuracy change (pts)</th>" in html
  assert '<td class="num">-4.00</td>' in html and '<td class="num">86.00</td>' in html
  assert "0.8600" not in html and "-0.0400" not in html     # no fraction beside the percent
  text = rep.table_text(table, ["group", "accuracy", "accuracy_change", "random_accuracy_change"])
  assert text.splitlines()[0].split() == ["group", "accuracy", "(%)", "accuracy", "change",
                                          "(pts)", "random", "accuracy", "change", "(pts)"]
  assert text.splitlines()[2].split()[-3:] == ["86.00", "-4.00", "-4.00"]
  assert text.splitlines()[3].split()[-3:] == ["60.00", "-30.00", "n/a"]
