"""Heads as parsers (heads_jax.hoststats.parsing): accuracies, baselines, intervals, agreement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from heads_jax.data.encoding import AnalysisExample, Segment
from heads_jax.hoststats.parsing import (arcs_table, best_heads, evaluable_arcs, parsing_table,
                                         relations_to_score, role_agreement)


def _setup(seed=0, n=30, words=8, L=2, H=3):
  """Random predictions; head (1, 2) predicts the previous word for every word but the first."""
  rng = np.random.default_rng(seed)
  pred = np.full((n, L, H, words + 2), -1)
  for s in range(n):
    for w in range(words):
      pred[s, :, :, w] = rng.choice([x for x in range(words) if x != w], size=(L, H))
    pred[s, 1, 2, 1:words] = np.arange(words - 1)
    pred[s, 1, 2, 0] = words - 1                 # the first word: the last one
  rows = []
  for s in range(n):
    for d in range(1, words):      # left-headed: head = dependent - 1
      rows.append((s, d, d - 1, "left"))
    rows.append((s, 0, 2, "nsubj"))  # right-headed, offset +2
  return pred, pd.DataFrame(rows, columns=["sequence", "dependent", "head", "relation"])


def test_previous_word_head_parses_every_left_headed_arc():
  pred, arcs = _setup()
  table = parsing_table(pred, arcs, relations=("nsubj",), min_arcs=100, bootstrap=200)
  left = table[(table["relation"] == "left") & (table["direction"] == "dep2head")]
  head = left[(left["kind"] == "head") & (left["layer"] == 1) & (left["head"] == 2)].iloc[0]
  assert head["accuracy"] == 1.0 and head["n"] == 30 * 7
  assert head["low"] == 1.0 and head["high"] == 1.0
  # the offset -1 baseline also gets every left-headed arc, +1 none
  base = left[left["kind"] == "offset"].set_index("offset")["accuracy"]
  assert base[-1] == 1.0 and base[1] == 0.0
  # head -> dependent: the head word's prediction (its own previous word) is never the dependent
  rev = table[(table["relation"] == "left") & (table["direction"] == "head2dep")
              & (table["layer"] == 1) & (table["head"] == 2)].iloc[0]
  assert rev["accuracy"] == 0.0
  # nsubj (30 arcs, below min_arcs, but always scored): baseline offset +2 is exact
  ns = table[(table["relation"] == "nsubj") & (table["direction"] == "dep2head")]
  assert ns[ns["kind"] == "offset"].set_index("offset")["accuracy"][2] == 1.0
  best = best_heads(table).set_index(["relation", "direction"])
  assert best.loc[("left", "dep2head"), "layer"] == 1 and best.loc[("left", "dep2head"), "head"] == 2
  assert best.loc[("left", "dep2head"), "baseline_offset"] == -1
  assert not best.loc[("left", "dep2head"), "beats_baseline"]  # ties the baseline


def test_accuracy_and_interval_by_hand():
  pred, arcs = _setup(seed=1, n=40)
  table = parsing_table(pred, arcs, relations=(), min_arcs=1, bootstrap=2000, seed=3)
  row = table[(table["relation"] == "left") & (table["direction"] == "dep2head")
              & (table["layer"] == 0) & (table["head"] == 1)].iloc[0]
  a = arcs[arcs["relation"] == "left"]
  hits = pred[a["sequence"], 0, 1, a["dependent"]] == a["head"].to_numpy()
  assert row["accuracy"] == pytest.approx(hits.mean())
  # a bootstrap over sentences: the interval holds the estimate, and its width is near
  # 2 * 1.96 * the standard error of the per-sentence accuracies
  per_seq = pd.Series(hits).groupby(a["sequence"].to_numpy()).mean()
  se = per_seq.std(ddof=1) / np.sqrt(len(per_seq))
  assert row["low"] < row["accuracy"] < row["high"]
  assert (row["high"] - row["low"]) == pytest.approx(2 * 1.96 * se, rel=0.25)


def test_truncated_words_and_relation_choice():
  pred, arcs = _setup(n=5)
  pred[0, :, :, 5:] = -1                        # words 5.. truncated away in sequence 0
  kept = evaluable_arcs(pred, arcs)
  dropped = arcs[(arcs["sequence"] == 0) & ((arcs["dependent"] >= 5) | (arcs["head"] >= 5))]
  assert len(kept) == len(arcs) - len(dropped) and len(dropped) == 3
  assert relations_to_score(kept, ("obj",), min_arcs=20) == ["obj", "left"]
  assert relations_to_score(kept, (), min_arcs=5) == ["left", "nsubj"]


def test_example_arcs_number_words_over_the_pair():
  a = Segment(text="x", words=("a", "b", "c"), heads=(1, -1, 1), deprels=("nsubj", "root", "obj"))
  b = Segment(text="y", words=("d", "e"), heads=(-1, 0), deprels=("root", "amod"))
  arcs = arcs_table([AnalysisExample(a, b), AnalysisExample(b)])
  assert arcs.values.tolist() == [[0, 0, 1, "nsubj"], [0, 2, 1, "obj"], [0, 4, 3, "amod"],
                                  [1, 1, 0, "amod"]]


def test_role_agreement_counts_and_correlation():
  pred, arcs = _setup(n=30)
  arcs["relation"] = arcs["relation"].replace({"left": "amod"})
  table = parsing_table(pred, arcs, relations=("amod",), bootstrap=200)
  # head (1, 2) parses amod perfectly, but ties the offset -1 baseline: no parsing head
  L, H = 2, 3
  tests = pd.DataFrame([(l, h, "amod", float(l * H + h), (l, h) in {(1, 2), (0, 0)})
                        for l in range(L) for h in range(H)],
                       columns=["layer", "head", "role", "mean", "assigned"])
  agree = role_agreement(table, tests, relations=("amod", "obj")).set_index("relation")
  assert list(agree.index) == ["amod"]
  assert agree.loc["amod", "role_heads"] == 2 and agree.loc["amod", "parsing_heads"] == 0
  assert agree.loc["amod", "both"] == 0 and agree.loc["amod", "jaccard"] == 0.0
  assert -1 <= agree.loc["amod", "spearman"] <= 1
