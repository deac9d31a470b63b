"""Ablations scored in SQuAD exact match / F1 (Guan et al. 2020, Tables 2 and 3): the SQuAD
evaluator against the span model called directly, the rows of the paper's tables (which heads,
which gate mode, which attention part), and `heads-jax ablate` on a tiny random span model."""

import json

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax.ablation import ablate, evaluate
from heads_jax.ablation import guan as guan_ablation
from heads_jax.ablation.groups import HeadGroup
from heads_jax.data import squad as sq
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.data.vocabulary import DISTANCE_FEATURES
from heads_jax.errors import UserError
from heads_jax.hoststats import claims as paper
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForQuestionAnswering
from heads_jax.training import squad as sqt
from tests.helpers import SHARED, requires_shared, skip_unless_ci

SQUAD_FILE = SHARED / "squad" / "dev-v2.0-first5.json"
SPEC = f"squad:{SQUAD_FILE}:v1:n=6:seed=3"
NAMES = ["vertical", "diagonal", "dense", "vertical", "dense+vertical", "diagonal", "dense",
         "vertical"]   # the 2 x 4 heads of the tiny model


@pytest.fixture(scope="module")
def tiny():
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  return BertForQuestionAnswering(cfg, rngs=nnx.Rngs(0)), tok


@pytest.fixture(scope="module")
def squad_data(tiny):
  if not SQUAD_FILE.is_file():
    skip_unless_ci(f"{SQUAD_FILE} not present")
  return evaluate.load_squad_eval_data(SPEC, tiny[1], max_length=64, doc_stride=32,
                                       max_query_length=16)


def _groups():
  by = {}
  for i, name in enumerate(NAMES):
    by.setdefault(name, []).append((i // 4, i % 4))
  return [HeadGroup(n, "cluster", tuple(h)) for n, h in by.items()]


@pytest.mark.slow
@requires_shared("squad")
def test_squad_evaluator_matches_the_model_called_directly(tiny, squad_data):
  model, _ = tiny
  ev = evaluate.SquadEvaluator(model, squad_data, batch_size=3)
  assert len(squad_data) == 6 and squad_data.task.is_pair and ev.metric_columns == ("exact_match", "f1")
  feats = squad_data.features
  L, H = ev.num_layers, ev.num_heads
  gate = np.ones((L, H), np.float32)
  gate[0, 1] = gate[1, 2] = 0.0
  removal = np.zeros((L, H, 2), np.float32)
  removal[:, :2, 0] = 1.0
  for kw in ({}, {"head_gate": gate, "gate_mode": "uniform"}, {"segment_removal": removal}):
    got = ev.evaluate(**kw)
    preds, scores = sqt.evaluate_model(model, feats, batch_size=len(feats), **kw)
    assert ev.last_predictions == preds
    assert got["exact_match"] == pytest.approx(scores["exact_match"] / 100)
    assert got["f1"] == pytest.approx(scores["f1"] / 100) and got["n"] == 6
  start, _ = ev.logits(head_gate=gate)
  direct = model(feats.input_ids, feats.attention_mask, feats.token_type_ids, head_gate=gate)
  np.testing.assert_allclose(start, np.asarray(direct["start_logits"]), atol=1e-5)
  # the ablations reach the logits (question and context are different token types)
  base = ev.logits()[0]
  assert not np.allclose(ev.logits(segment_removal=removal)[0], base)
  assert not np.allclose(ev.logits(head_gate=gate, gate_mode="uniform")[0], ev.logits(head_gate=gate)[0])


def test_squad_data_and_model_refusals(tiny, tmp_path):
  with pytest.raises(UserError, match="not SQuAD data"):
    evaluate.load_squad_eval_data("sst2", tiny[1])
  assert evaluate.is_squad_spec("squad:x.json:v1") and not evaluate.is_squad_spec("glue:mrpc")
  from heads_jax.model.heads import BertForSequenceClassification
  clf = BertForSequenceClassification(tiny[0].config.replace(pooler=True), 2, rngs=nnx.Rngs(0))
  with pytest.raises(UserError, match="not a SQuAD"):
    evaluate.check_span_model(clf)


class _Recorder:
  """A stand-in evaluator that records what each row asks for."""
  num_layers, num_heads = 2, 4
  metric_columns = ("exact_match", "f1")

  def __init__(self):
    self.calls = []

  def evaluate(self, head_gate=None, gate_mode="remove", segment_removal=None):
    self.calls.append((head_gate, gate_mode, segment_removal))
    return {"exact_match": 0.5 - 0.01 * len(self.calls), "f1": 0.6, "n": 10}


def test_paper_table_rows_ablate_the_paper_types():
  rec = _Recorder()
  table = guan_ablation.paper_tables(rec, _groups(), base={"exact_match": 0.5, "f1": 0.6})
  assert list(table["id"]) == list(range(1, 20)) and list(table["table"]) == [2] * 11 + [3] * 8
  # the paper's values beside (fractions of its percent)
  assert table.loc[table.id == 3, "paper_exact_match"].item() == pytest.approx(0.0459)
  assert table.loc[table.id == 19, "paper_f1"].item() == pytest.approx(0.8410)
  calls = dict(zip(table["id"], rec.calls))
  heads = {n: [(i // 4, i % 4) for i, m in enumerate(NAMES) if m == n] for n in set(NAMES)}

  def zeros(gate):
    return sorted(map(tuple, np.argwhere(gate == 0).tolist()))

  assert zeros(calls[1][0]) == [] and calls[1][1] == "remove"
  assert zeros(calls[3][0]) == heads["diagonal"] and calls[3][1] == "remove"      # prune diagonal
  assert zeros(calls[6][0]) == sorted(heads["dense"] + heads["vertical"])          # dense + vertical
  assert zeros(calls[7][0]) == sorted(heads["dense+vertical"] + heads["vertical"])
  assert zeros(calls[10][0]) == heads["dense+vertical"] and calls[10][1] == "uniform"  # 1/L
  r12 = calls[12][2]                     # diagonal intra-sentence attention removed
  assert sorted(map(tuple, np.argwhere(r12[..., 0] == 1).tolist())) == heads["diagonal"]
  assert r12[..., 1].sum() == 0
  r19 = calls[19][2]                     # inter removed from every type but dense+vertical
  others = sorted(h for n in ("dense", "diagonal", "vertical") for h in heads[n])
  assert sorted(map(tuple, np.argwhere(r19[..., 1] == 1).tolist())) == others
  assert r19[..., 0].sum() == 0
  assert table.loc[table.id == 3, "num_heads"].item() == 2
  assert table.loc[table.id == 5, "exact_match_change"].item() == pytest.approx(-0.05)
  assert not table["missing_types"].astype(bool).any()
  # a clustering without a type: its rows are marked
  part = [g for g in _groups() if g.name != "vertical"]
  t2 = guan_ablation.paper_tables(_Recorder(), part, base={"exact_match": 0.5, "f1": 0.6})
  assert t2.loc[t2.id == 5, "missing_types"].item() == "vertical"
  with pytest.raises(UserError, match="none of the cluster types"):
    guan_ablation.paper_tables(_Recorder(), [HeadGroup("x", "cluster", ((0, 0),))])
  assert [r["id"] for r in guan_ablation.table2_settings()] == [r[0] for r in paper.GUAN_TABLE2]


@requires_shared("squad")
def test_group_ablation_in_exact_match_and_f1(tiny, squad_data):
  ev = evaluate.SquadEvaluator(tiny[0], squad_data, batch_size=8)
  table = ablate.ablate_groups(ev, _groups()[:2], mode="uniform", random_seeds=1)
  assert {"exact_match", "exact_match_change", "f1", "random_f1_change"} <= set(table.columns)
  assert "accuracy" not in table.columns and table["exact_match_change"].iloc[0] == 0.0
  seg = ablate.ablate_segments(ev, _groups()[:1], parts="intra", random_seeds=0)
  assert seg["ablation"].tolist() == ["none", "intra"]
  with pytest.raises(UserError, match="--mode mean needs a GLUE classifier"):
    ablate.ablate_groups(ev, _groups()[:1], mode="mean")


@pytest.mark.slow
@requires_shared("squad")
def test_ablate_pipeline_on_a_squad_model(tiny, tmp_path):
  from heads_jax.pipelines.ablate import AblationConfig, run_ablation
  model, tok = tiny
  save_model(model, tmp_path / "qa", tok)
  ana = tmp_path / "analysis"
  ana.mkdir()
  pd.DataFrame([{"layer": i // 4, "head": i % 4, **{f: 1 / 21 for f in DISTANCE_FEATURES},
                 "cluster": 0, "cluster_name": n, "tsne_x": 0.0, "tsne_y": 0.0}
                for i, n in enumerate(NAMES)]).to_csv(ana / "clusters.csv", index=False)
  out = tmp_path / "out"
  res = run_ablation(AblationConfig(model=str(tmp_path / "qa"), data=SPEC, out=str(out),
                                    analysis=str(ana), by="cluster", cross="intra",
                                    paper_tables=True, random_seeds=1, max_length=64,
                                    batch_size=8), log=lambda *_: None)
  assert set(res["baseline"]) == {"exact_match", "f1", "n"} and res["baseline"]["n"] == 6
  tables = pd.read_csv(out / "paper_tables.csv")
  assert len(tables) == 19
  assert tables.loc[tables.id == 1, "exact_match"].item() == pytest.approx(res["baseline"]["exact_match"])
  assert tables.loc[tables.id == 1, "paper_exact_match"].item() == pytest.approx(0.8285)
  assert "exact_match_change" in pd.read_csv(out / "ablation.csv").columns
  html = (out / "report.html").read_text()
  assert "Guan et al. Tables 2 and 3" in html and "82.85" in html
  assert json.loads((out / "ablation.json").read_text())["paper_tables"][0]["id"] == 1
  with pytest.raises(UserError, match="for GLUE classifiers"):
    run_ablation(AblationConfig(model=str(tmp_path / "qa"), data=SPEC, out=str(out),
                                importance=True, max_length=64))


def test_regression_task_is_refused_by_the_classifier_evaluator(tiny):
  from heads_jax.data.glue import TASKS
  from heads_jax.model.heads import BertForSequenceClassification
  clf = BertForSequenceClassification(tiny[0].config.replace(pooler=True), 1, rngs=nnx.Rngs(0))
  z = np.zeros((2, 4), np.int32)
  data = evaluate.EvalData(z, z, z, np.zeros(2, np.float32), TASKS["stsb"], "stsb")
  with pytest.raises(UserError, match="STS-B|stsb is a regression"):
    evaluate.Evaluator(clf, data)
