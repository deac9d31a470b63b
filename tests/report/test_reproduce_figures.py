"""What the reproduce report hands to the verdicts: each task's majority-class bar beside its dev
scores, and the analysed model in words (issue 41 item 3)."""
from __future__ import annotations

import types

import numpy as np

from heads_jax.hoststats import claims as paper
from heads_jax.pipelines.reproduce import majority_share
from heads_jax.report.reproduce import run_figures


def test_majority_share_of_the_evaluation_rows():
  rows = [types.SimpleNamespace(label=x) for x in (1, 1, 0, 1)]
  assert majority_share(rows) == {"majority": 0.75, "n": 4}
  assert majority_share([types.SimpleNamespace(label=2.5)]) == {"majority": None, "n": 1}
  assert majority_share([types.SimpleNamespace(label=None)]) == {"majority": None, "n": 0}


def test_run_figures_carries_the_majority_bar_and_the_model():
  roles = ("local", "delimiter")
  a = paper.Analysis(roles=roles, assigned=np.zeros((6, 12, 2), bool),
                     means=np.ones((6, 12, 2)), tau=3.0)
  results = {"tasks": ["mrpc"], "per_task": {"pretrained": {"mrpc": {"analysis": a}},
                                             "finetuned": {"mrpc": {"analysis": a}}},
             "pooled": {"pretrained": {}, "finetuned": {}},
             "pretrained": {"model": "/somewhere/all-MiniLM-L6-v2"},
             "finetune": {"mrpc": {"best": {"accuracy": 0.684, "f1": 0.81, "step": 30},
                                   "eval_labels": {"majority": 0.684, "n": 408}}}}
  run = run_figures(results)
  assert run.finetune["mrpc"] == {"accuracy": 0.684, "f1": 0.81, "step": 30, "majority": 0.684,
                                  "n": 408}
  # the name once; the verdicts' details add the shape once (issue 48 item 6: it was printed twice)
  assert run.model == "all-MiniLM-L6-v2" and run.bert_base is False
  e = paper.evaluate(paper.claim("share_delimiter"), run)
  assert "this run: all-MiniLM-L6-v2 (6 layers x 12 heads);" in e.detail
  assert e.detail.count("6 layers x 12 heads") == 1
  assert paper.beats_majority(run.finetune["mrpc"])[0] is False   # a constant classifier
