"""The ``guan`` reproduce preset end to end on tiny random models: the SQuAD model analysed on
a few random questions of the shared SQuAD file (K = 4 clusters), a second model for Table 1,
Tables 2-3 in EM/F1 beside the paper's values, one report; a rerun reuses every stage."""

import pandas as pd
import pytest
from flax import nnx

from heads_jax.data import assets
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForQuestionAnswering, BertForSequenceClassification
from heads_jax.pipelines import guan
from heads_jax.training import configlib
from tests.helpers import SHARED, requires_shared


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  root = tmp_path_factory.mktemp("models")
  save_model(BertForQuestionAnswering(cfg, rngs=nnx.Rngs(0)), root / "squad", tok)
  save_model(BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(1)), root / "mrpc", tok,
             id2label={0: "not_equivalent", 1: "equivalent"})
  return root


def _config(models, **extra):
  c = configlib.load_config("configs/reproduce.py:guan_toy")
  c.squad_model = str(models / "squad")
  c.squad_data = f"squad:{SHARED / 'squad' / 'dev-v2.0-first5.json'}:v1"
  c.models.mrpc = str(models / "mrpc")
  c.model_data.mrpc = f"glue-tsv:{assets.glue_dir()}/MRPC:dev"
  c.analysis.max_examples = 8
  c.analysis.report = False   # the analysis reports (Figs. 1-3, 5) are tested with `analyze`
  c.ablation.max_examples = 4
  for k, v in extra.items():
    setattr(c, k, v)
  return c


def test_presets_and_plan():
  c = configlib.load_config("configs/reproduce.py:guan")
  assert c.pipeline == "guan" and c.squad_model == guan.DEFAULT_SQUAD_MODEL
  assert c.samples == 1000 and c.clusters == 4 and c.analysis.max_length == 384
  plan = guan.plan_models(c)
  assert [p["label"] for p in plan] == ["squad"] and plan[0]["data"].endswith(":n=1000:seed=0")
  c.models.mnli = "some/dir"
  assert guan.plan_models(c)[-1] == {"label": "mnli", "model": "some/dir",
                                     "data": "glue:mnli:validation_matched"}
  c.squad_data = "glue:mrpc"
  with pytest.raises(UserError, match="must be SQuAD data"):
    guan.plan_models(c)
  c.squad_data = "squad-tfds"
  for field, value in (("samples", 0), ("seed", -1)):
    bad = configlib.load_config("configs/reproduce.py:guan")
    setattr(bad, field, value)
    with pytest.raises(UserError, match=rf"--config.{field} must be an integer >= {int(field == 'samples')}"):
      guan.plan_models(bad)


def test_table1_paper_values():
  from heads_jax.report import guan as guan_report
  t = guan_report.table1({"squad": {"stability": 0.9}, "mrpc": {"stability": None}})
  assert t["model"].tolist() == ["SQuAD", "Pre-train", "MRPC", "MNLI"]
  assert t["paper"].tolist() == pytest.approx([96.26, 95.98, 95.98, 94.37])
  assert t["this run"][0] == pytest.approx(90.0) and t["analysed"].tolist() == [True, False, True, False]


def test_default_hub_model_is_not_downloaded(tmp_path):
  c = configlib.load_config("configs/reproduce.py:guan_toy")
  with pytest.raises(UserError, match="bert-large-uncased-whole-word-masking-finetuned-squad"):
    guan.run_guan(c, tmp_path / "run", log=lambda *_: None)


@pytest.mark.slow
@requires_shared("squad")
def test_guan_end_to_end_and_rerun(models, tmp_path):
  lines = []
  res = guan.run_guan(_config(models), tmp_path / "run", log=lines.append)
  analyses = res["analysis"]
  assert set(analyses) == {"squad", "mrpc"}
  for a in analyses.values():
    assert 0.0 <= a.stability <= 1.0
  tables = pd.read_csv(tmp_path / "run" / "ablation" / "paper_tables.csv")
  assert tables["id"].tolist() == list(range(1, 20))
  assert tables.loc[tables.id == 9, "paper_f1"].item() == pytest.approx(0.0607)
  html = (tmp_path / "run" / "report.html").read_text()
  for text in ("Table 1", "96.26", "94.37", "Fig. 4", "Guan et al. Tables 2 and 3", "82.85",
               "analysis/squad/report.html", "Fig. 4 (MRPC)"):
    assert text in html, text
  t1 = {r["model"]: r for r in res["report"]["table1"]}
  assert t1["SQuAD"]["this run"] == pytest.approx(100 * analyses["squad"].stability, abs=0.005)
  # the same command again reuses every stage
  again = []
  guan.run_guan(_config(models), tmp_path / "run", log=again.append)
  assert sum("done earlier, reused" in line for line in again) == 6, again


@pytest.fixture
def recorded_guan(tmp_path, monkeypatch):
  """run_guan with every unit's work replaced by a recorder (the keys are the real ones):
  ``run(config) -> [(stage, unit) run]``."""
  from heads_jax.pipelines import engine, stages
  tables = tmp_path / "tables.csv"
  tables.write_text("id\n1\n")
  canned = {"scores": {"out": str(tmp_path), "model": "m", "data": ["d"], "data_info": []},
            "analysis": {"out": str(tmp_path), "model": "m", "data": "d", "stability": 0.5},
            "ablation_baseline": {"metrics": {"exact_match": 0.1, "f1": 0.2}, "metric_names":
                                  ["exact_match", "f1"], "task": "squad", "evaluation set": "s",
                                  "examples": 1, "layers": 1, "heads": 1},
            "ablation_paper_tables": {"files": [str(tables)], "record": [], "lines": [],
                                      "notes": {}},
            "ablation_report": {"baseline": {"exact_match": 0.1, "f1": 0.2},
                                "files": {"paper_tables": str(tables)}, "report": "r.html"},
            "report": {"report": "report.html", "table1": [], "claims": "c.csv", "verdicts": {}}}
  calls = []
  real = engine.run_unit

  def run_unit(ctx, stage, unit, key, fn, clean=(), intact=None, paths=()):
    return real(ctx, stage, unit, key, lambda: calls.append((stage, unit)) or canned[stage], clean,
                paths=paths)
  monkeypatch.setattr(engine, "run_unit", run_unit)
  monkeypatch.setattr(stages, "run_unit", run_unit)

  def run(config):
    calls.clear()
    guan.run_guan(config, tmp_path / "run", log=lambda *_: None)
    return list(calls)
  return run


@requires_shared("squad")
def test_guan_a_replaced_input_reruns_exactly_its_readers(recorded_guan, tmp_path):
  """The SQuAD file and a Table 1 model replaced behind the same paths (same size, mtime set
  back): the units reading them rerun, the others are reused (issue 34). The work is recorded,
  so the models are stand-in directories."""
  import shutil
  from tests.test_runfiles import swap_bytes_keep_stat
  squad_file = tmp_path / "squad.json"
  shutil.copy(SHARED / "squad" / "dev-v2.0-first5.json", squad_file)
  models = tmp_path / "models"
  for name in ("squad", "mrpc"):
    (models / name).mkdir(parents=True)
    (models / name / "heads_jax.json").write_text(f'{{"model": "{name}"}}')
    (models / name / "params.safetensors").write_bytes(b"weights")
  mrpc = models / "mrpc"
  c = _config(models, squad_data=f"squad:{squad_file}:v1")
  ablation = [("ablation_baseline", "baseline"), ("ablation_paper_tables", "paper_tables"),
              ("ablation_report", "report")]
  everything = [("scores", "squad"), ("scores", "mrpc"), ("analysis", "squad"),
                ("analysis", "mrpc"), *ablation, ("report", "report")]
  assert recorded_guan(c) == everything
  assert recorded_guan(c) == []
  swap_bytes_keep_stat(mrpc / "heads_jax.json")
  assert recorded_guan(c) == [("scores", "mrpc"), ("analysis", "mrpc"), ("report", "report")]
  swap_bytes_keep_stat(squad_file)
  assert recorded_guan(c) == [("scores", "squad"), ("analysis", "squad"), *ablation,
                              ("report", "report")]
  # a host-only change (tau): the host statistics and the report; no device pass, and the
  # ablation (evaluations on the device) keeps its result while the cluster types it reads are
  # the same
  c.analysis.tau = 4.0
  assert recorded_guan(c) == [("analysis", "squad"), ("analysis", "mrpc"), ("report", "report")]
