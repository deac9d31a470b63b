"""`heads-jax ablate --by role` runs the causal test of each role (causal.csv, the report's
section), and --mode mean reaches the group table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification
from heads_jax.pipelines.ablate import AblationConfig, run_ablation


def tiny_classifier_with_roles(tmp_path, max_positions: int = 64):
  """A tiny random MRPC classifier in ``tmp_path/m`` and an analysis folder whose tests.csv
  assigns delimiter to head 0:1 and local to head 1:2 (2 layers x 4 heads): ``(model, analysis)``."""
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=max_positions,
                   initializer_range=0.2)
  save_model(BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(0)), tmp_path / "m", tok,
             id2label={0: "not_equivalent", 1: "equivalent"})
  ana = tmp_path / "analysis"
  ana.mkdir()
  rows = [(l, h, role, 1.0, 10, 1.0, 0.5, 0.5, (l, h, role) in {(0, 1, "delimiter"), (1, 2, "local")})
          for l in range(2) for h in range(4) for role in ("local", "delimiter")]
  pd.DataFrame(rows, columns=["layer", "head", "role", "mean", "n", "statistic", "p_value",
                              "p_adjusted", "assigned"]).to_csv(ana / "tests.csv", index=False)
  return tmp_path / "m", ana


@pytest.mark.slow   # a classifier evaluated for every role and random group (about 30 s)
def test_role_ablation_runs_the_causal_test(tmp_path):
  _, ana = tiny_classifier_with_roles(tmp_path)
  out = tmp_path / "out"
  run_ablation(AblationConfig(model=str(tmp_path / "m"), data="mrpc", out=str(out),
                              analysis=str(ana), by="role", mode="mean", random_groups=3,
                              random_seeds=1, max_examples=12, batch_size=8, max_length=48),
               log=lambda *_: None)
  table = pd.read_csv(out / "ablation.csv")
  assert set(table["ablation"]) == {"none", "mean"}
  test = pd.read_csv(out / "causal.csv").set_index("group")
  assert set(test.index) == {"local", "delimiter", "unskilled"}   # the groups with heads
  assert test.loc["delimiter", "layers"] == "0x1" and test.loc["local", "layers"] == "1x1"
  assert test["random_groups"].eq(3).all()
  assert np.all((test["p_value"] >= 1 / 4) & (test["p_value"] <= 1))
  assert "Causal test of the roles" in (out / "report.html").read_text()
