"""`heads-jax ablate --attribution --patching --prune` (issue 51 items 3-4): the parts as stages
of the ablate job (content-keyed, --redo), their files, the report's section, and one-line
refusals (m < 1, a corrupted set of another length, no task head)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.bert import BertModel
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.pipelines.ablate import AblationConfig, run_ablation
from tests.pipelines.test_ablate import _stage_states
from tests.pipelines.test_ablate_causal import tiny_classifier_with_roles


def _model(tmp_path):
  return tiny_classifier_with_roles(tmp_path, max_positions=48)


@pytest.mark.slow   # attribution, patching and five pruning orders of a tiny classifier
def test_attribution_patching_and_pruning_run_as_stages_of_the_ablate_job(tmp_path):
  model, ana = _model(tmp_path)
  out = tmp_path / "out"
  cfg = AblationConfig(model=str(model), data="mrpc", out=str(out), analysis=str(ana),
                       attribution=True, patching=True, prune=True, prune_once=True,
                       prune_step=0.5, steps=2, maps=2, random_groups=3, random_seeds=1,
                       max_examples=8, batch_size=4, max_length=40)
  lines = []
  run_ablation(cfg, log=lines.append)
  states = _stage_states(lines)
  assert states == {s: "run" for s in ("baseline", "importance", "attribution",
                                       "patching", "carriers", "head_pruning", "report")}
  attr = pd.read_csv(out / "attribution.csv")
  assert len(attr) == 8 and (attr["low"] <= attr["value"] + 1e-9).all()
  assert sorted(attr["rank"]) == list(range(1, 9))
  maps = np.load(out / "attribution_maps.npy")
  assert maps.shape[:3] == (2, 2, 4) and maps.shape[3] == maps.shape[4]
  patch = pd.read_csv(out / "patching.csv")
  assert {"value", "low", "high", "estimated_value"} <= set(patch.columns)
  carriers = pd.read_csv(out / "carriers.csv")
  assert set(carriers["ablation"]) == {"attribution", "patching"}
  assert set(carriers["group"]) >= {"local", "delimiter"}
  curve = pd.read_csv(out / "head_pruning.csv")
  assert set(curve["method"]) == {"attribution", "importance", "role", "random"}
  assert (curve["n"] == 4).all()                               # the 4 held-out rows
  assert (curve["accuracy_low"] <= curve["accuracy"]).all()
  first = curve[curve["num_pruned"] == 0]
  assert first["accuracy"].nunique() == 1                      # one held-out set for every order
  role = curve[(curve["method"] == "role") & (curve["num_pruned"] == 4)].iloc[0]
  assert {"0:1", "1:2"} <= set(role["pruned"].split(","))      # role heads pruned first
  html = (out / "report.html").read_text()
  assert "Which heads carry the prediction" in html and "Hao et al." in html
  assert {"head_grid.png", "head_pruning.png"} <= {p.name for p in (out / "figures").glob("*.png")}
  record = json.loads((out / "ablation.json").read_text())
  assert record["attribution"]["steps"] == 2 and "correlation with attribution patching" in record["patching"]
  # a rerun reuses every part; --redo patching reruns it and what reads it only
  lines.clear()
  run_ablation(cfg, log=lines.append)
  assert set(_stage_states(lines).values()) == {"reused"}
  lines.clear()
  run_ablation(cfg, log=lines.append, redo="patching")
  states = _stage_states(lines)
  assert states["patching"] == states["carriers"] == "run" and states["attribution"] == "reused"


@pytest.mark.slow
def test_bad_requests_are_one_line(tmp_path):
  model, _ = _model(tmp_path)
  base = dict(model=str(model), data="mrpc", out=str(tmp_path / "o"), max_examples=4,
              batch_size=4, max_length=40)
  with pytest.raises(UserError, match=r"--steps 0: give a whole number of at least 1 \(the integral"):
    run_ablation(AblationConfig(**base, attribution=True, steps=0))
  with pytest.raises(UserError, match="--corrupt tsv and --corrupted FILE go together"):
    run_ablation(AblationConfig(**base, patching=True, corrupt="tsv"))
  assert not (tmp_path / "o").exists()
  tsv = tmp_path / "c.tsv"
  tsv.write_text("sentence1\tsentence2\na\tb\n")
  with pytest.raises(UserError, match="the corrupted set has 1 rows, the clean set 2"):
    run_ablation(AblationConfig(**base, patching=True, corrupt="tsv", corrupted=str(tsv)),
                 log=lambda *_: None)
  tok = load_tokenizer(None)
  save_model(BertModel(config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=48),
                       rngs=nnx.Rngs(0)), tmp_path / "enc", tok)
  with pytest.raises(UserError, match="not a fine-tuned classifier"):
    run_ablation(AblationConfig(**dict(base, model=str(tmp_path / "enc"), out=str(tmp_path / "o2")),
                                attribution=True), log=lambda *_: None)
