"""`heads-jax ablate` end to end on a tiny classifier, and the compare report's similarity part."""

import argparse
import json

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.ablation import evaluate
from heads_jax.pipelines.ablate import run_ablation
from heads_jax.analyze import ablate as ablate_entry
from heads_jax.pipelines.compare import attention_similarity_section
from heads_jax.data.vocabulary import DISTANCE_FEATURES
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  model = BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(0))
  path = tmp_path_factory.mktemp("model") / "m"
  save_model(model, path, tok, id2label={0: "not_equivalent", 1: "equivalent"})
  return path


@pytest.fixture(scope="module")
def analysis_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("analysis")
  names = ["vertical", "diagonal", "dense", "vertical", "dense+vertical", "diagonal", "dense", "vertical"]
  rows = []
  for i, name in enumerate(names):
    row = {"layer": i // 4, "head": i % 4, **{f: 1 / 21 for f in DISTANCE_FEATURES},
           "cluster": 0, "cluster_name": name, "tsne_x": 0.0, "tsne_y": 0.0}
    rows.append(row)
  pd.DataFrame(rows).to_csv(d / "clusters.csv", index=False)
  return d


def _args(**kw):
  p = argparse.ArgumentParser()
  ablate_entry.add_args(p)
  argv = []
  for k, v in kw.items():
    flag = "--" + k.replace("_", "-")
    if v is True:
      argv.append(flag)
    elif isinstance(v, list):
      for x in v:
        argv += [flag, str(x)]
    else:
      argv += [flag, str(v)]
  return ablate_entry.to_config(p.parse_args(argv))


@pytest.mark.slow
def test_ablate_cli_end_to_end(tiny_dir, analysis_dir, tmp_path):
  out = tmp_path / "out"
  lines = []
  res = run_ablation(_args(model=tiny_dir, data="mrpc", max_examples=12, out=out,
                               analysis=analysis_dir, by="cluster", cross="both",
                               cluster=["vertical", "diagonal"], prune=True, prune_step=0.5,
                               random_seeds=1, batch_size=8, max_length=64),
                         log=lines.append)
  table = pd.read_csv(out / "ablation.csv")
  assert list(table["group"]) == ["none (unablated)", "dense", "diagonal", "dense+vertical", "vertical"]
  assert list(table["num_heads"]) == [0, 2, 2, 1, 3]
  base = table.iloc[0]
  assert np.allclose(table["accuracy_change"], table["accuracy"] - base["accuracy"])
  seg = pd.read_csv(out / "segment_ablation.csv")
  assert set(seg["ablation"]) == {"none", "intra", "inter"} and set(seg["group"]) == {
      "none (unablated)", "vertical", "diagonal"}
  assert not seg["renormalised"].any()
  curve = pd.read_csv(out / "pruning.csv")
  first = curve[(curve["method"] == "importance") & (curve["num_pruned"] == 0)].iloc[0]
  assert first["accuracy"] == pytest.approx(base["accuracy"])
  assert sorted(curve["share_pruned"].unique()) == [0.0, 0.5, 1.0]
  imp = pd.read_csv(out / "importance.csv")
  assert len(imp) == 8 and np.allclose(imp.groupby("layer")["importance"].apply(
      lambda v: np.sqrt((v ** 2).sum())), 1.0, atol=1e-4)
  html = (out / "report.html").read_text()
  for title in ("Ablation by cluster", "Intra- and inter-sentence attention removed",
                "Head importance", "Pruning curve", "NOT renormalised"):
    assert title in html
  assert html.count("data:image/png;base64,") == 4
  summary = json.loads((out / "ablation.json").read_text())
  assert summary["baseline"]["n"] == 12
  assert any("report:" in line for line in lines)
  assert (out / "figures" / "pruning.png").is_file()


def test_ablate_cli_errors(tiny_dir, tmp_path):
  with pytest.raises(UserError, match="nothing to do"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o"))
  with pytest.raises(UserError, match="needs --analysis"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o", by="cluster",
                           max_examples=4, max_length=64))
  with pytest.raises(UserError, match="--max-length 128 exceeds the model's 64 positions"):
    run_ablation(_args(model=tiny_dir, data="mrpc", out=tmp_path / "o", by="layer",
                           max_examples=4))
  with pytest.raises(UserError, match="not GLUE data"):
    run_ablation(_args(model=tiny_dir, data="ud-ewt", out=tmp_path / "o", by="layer", max_length=64))


def test_eval_rows_from_finetune_data_json(tmp_path):
  tok = load_tokenizer(None)
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_idx": [5, 1, 3]}))
  rows = evaluate.eval_rows_from_finetune(tmp_path)
  data = evaluate.load_eval_data("mrpc", tok, rows=rows)
  assert len(data) == 3 and data.rows.tolist() == [1, 3, 5]
  everything = evaluate.load_eval_data("mrpc", tok, max_examples=6)
  np.testing.assert_array_equal(data.labels, everything.labels[[1, 3, 5]])
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_idx": [100000]}))
  with pytest.raises(UserError, match="not in"):
    evaluate.load_eval_data("mrpc", tok, rows=evaluate.eval_rows_from_finetune(tmp_path))
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_split": "dev"}))
  assert evaluate.eval_rows_from_finetune(tmp_path / "data.json") is None


def test_compare_attention_similarity_section(tiny_dir, tmp_path):
  lines = []
  sec = attention_similarity_section(tiny_dir, tiny_dir, tmp_path, data="mrpc", max_examples=6,
                                     max_length=64, log=lines.append)
  table = pd.read_csv(tmp_path / "attention_similarity.csv")
  assert len(table) == 8 and np.allclose(table["cosine"], 1.0, atol=1e-5)
  assert "Kovaleva" in sec["html"] and (tmp_path / "figures" / "attention_similarity.png").is_file()
  assert "mean cosine 1.000" in lines[0]
  with pytest.raises(UserError, match="--data"):
    attention_similarity_section(tiny_dir, tiny_dir, tmp_path)
