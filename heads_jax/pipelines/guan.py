"""Guan et al. 2020 ("How far does BERT look at", COLING) in one command:
``heads-jax reproduce --config configs/reproduce.py:guan --workdir DIR``.

Stages (on the stage engine, `heads_jax.pipelines.engine`, one lock and directory claim: a rerun
reuses every finished unit whose settings and inputs did not change, the inputs by content: the
SQuAD file's, each model's files or, for a hub id, the snapshot its ref names; ``--redo STAGE``
reruns one and what reads it):

1. ``scores`` and ``analysis``, the device pass and the host statistics of: the SQuAD model (``config.squad_model``: a path or a hub id, default
   ``bert-large-uncased-whole-word-masking-finetuned-squad``, resolved through
   `heads_jax.hub`'s cache) analysed on ``config.samples`` random SQuAD questions ("the distance
   features are averaged over 1,000 SQuAD samples"), clustered into ``config.clusters`` = 4
   types (Figs. 1-3 and 5 in its analysis report); then each further model of
   ``config.models`` (``pretrained``, ``mrpc``, ``mnli``: a path or hub id each, "" to leave it
   out) on its data (``config.model_data``; the pre-trained model on the same SQuAD samples), for
   Table 1 (the stability of each model's clustering) and Fig. 4 (the types per layer of every
   model).
2. ``ablation_baseline``, ``ablation_paper_tables``, ``ablation_report``: Tables 2 and 3 row by
   row on the SQuAD model (`heads_jax.ablation.guan` through the ablate job's stages,
   `heads_jax.pipelines.ablation.ablation_stages`, in this run's lock and claim), scored in exact
   match and F1 on ``config.eval_data`` (the SQuAD v1.1 dev set in the paper), the types from
   the SQuAD model's clustering (keyed by clusters.csv's content: a host-only change that leaves
   the types as they were repeats no evaluation).
3. ``report``: ``DIR/report.html`` and ``DIR/guan_claims.csv`` (`heads_jax.report.guan`):
   Guan et al.'s claims judged in their setting, Table 1 and Tables 2-3 beside the paper's
   values, the figures, and links to each analysis report.

Outputs: ``DIR/analysis/<label>/`` (analysis directories), ``DIR/ablation/`` (the ablate
outputs, ``paper_tables.csv``), ``DIR/report.html``, ``DIR/guan_claims.csv``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_collections
import pandas as pd

from heads_jax import contract, hub
from heads_jax.errors import UserError
from heads_jax.pipelines import engine
from heads_jax.pipelines.ablation import (REPORT, AblationConfig, AblationJob, ablation_job,
                                          ablation_stages)
from heads_jax.pipelines.analysis import AnalysisConfig
from heads_jax.pipelines import names, stages
from heads_jax.report.guan import MODEL_LABELS  # the analyses, SQuAD first (Table 1's columns)

# The job's one typed config: configs/reproduce.py's guan presets (every stage reads it as
# ctx.config; `_analysis_config` and `ablation_config` derive the units' typed settings).
GuanConfig = ml_collections.ConfigDict

DEFAULT_SQUAD_MODEL = "bert-large-uncased-whole-word-masking-finetuned-squad"
STAGES = names.GUAN


def _resolve(name: str, what: str) -> Path:
  """A model path or hub id as a local directory (the hub's cache; one line when absent)."""
  try:
    return hub.model_path(str(name))
  except FileNotFoundError:
    raise UserError(f"{what} {name!r} is neither an existing path nor a Hugging Face hub "
                    "id") from None


def _squad_sample_spec(data: str, samples, seed) -> str:
  """``data`` (a ``squad:`` / ``squad-tfds:`` spec) with ``:n=samples:seed=seed``."""
  for name, value, low in (("samples", samples, 1), ("seed", seed, 0)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise UserError(f"--config.{name} must be an integer >= {low} (the "
                      + ("number of SQuAD questions analysed" if name == "samples" else
                         "seed of their random draw") + f"); got {value!r}")
  if str(data).split(":", 1)[0] not in ("squad", "squad-tfds"):
    raise UserError(f"config.squad_data must be SQuAD data (squad:FILE or squad-tfds:...), got "
                    f"{data!r}")
  if ":n=" in data or ":seed=" in data:
    raise UserError(f"config.squad_data {data!r} already samples; give the plain spec and "
                    "config.samples / config.seed")
  return f"{data}:n={int(samples)}:seed={int(seed)}"


def plan_models(config) -> list[dict]:
  """The analyses: ``[{label, model, data}]``, the SQuAD model first, then each model of
  ``config.models`` that is set."""
  squad_data = _squad_sample_spec(config.squad_data, config.samples, config.seed)
  plan = [{"label": "squad", "model": config.squad_model or DEFAULT_SQUAD_MODEL,
           "data": squad_data}]
  for label in MODEL_LABELS[1:]:
    model = config.models.get(label, "")
    if model:
      data = config.model_data.get(label, "") or squad_data
      plan.append({"label": label, "model": model, "data": data})
  return plan


def _analysis_config(config, item: dict, model_dir: Path, out: Path) -> AnalysisConfig:
  """``config.analysis`` (`AnalysisConfig.from_config`) for the analysis of ``item``."""
  return AnalysisConfig.from_config(
      config.analysis, model=str(model_dir), data=(item["data"],), out=str(out),
      max_examples=int(config.analysis.max_examples) or None, clusters=int(config.clusters),
      seed=int(config.seed), syntax=False, parser="none",
      title=f"Guan et al. analysis: {item['label']} model ({item['model']})")


def planned_analyses(ctx: engine.Context[GuanConfig]) -> list[tuple[dict, AnalysisConfig]]:
  """``[(item, AnalysisConfig)]`` of each model of the plan (`plan_models`)."""
  config = ctx.config
  out = []
  for item in plan_models(config):
    model_dir = _resolve(item["model"], f"config.models.{item['label']}"
                         if item["label"] != "squad" else "config.squad_model")
    out.append((item, _analysis_config(config, item, model_dir,
                                       ctx.workdir / "analysis" / item["label"])))
  return out


def _stage_scores(ctx: engine.Context[GuanConfig]) -> dict:
  """``{label: `stages.Scores`}``: the device pass of each model's analysis (keyed by the
  model's content, the data's and the device-side settings)."""
  out = {}
  for item, cfg in planned_analyses(ctx):
    ctx.sub(f"the {item['label']} model {item['model']} on {item['data']}")
    out[item["label"]] = stages.scores(ctx, "scores", item["label"], cfg,
                                       model=ctx.model(item["model"]))
  return out


def _stage_analysis(ctx: engine.Context[GuanConfig]) -> dict:
  """``{label: `stages.Analysis`}``: the host statistics (distance clusters, tests, report) of
  each model's analysis, keyed by its device pass and the host settings."""
  device = ctx.results["scores"]
  return {item["label"]: stages.statistics(ctx, "analysis", item["label"], cfg,
                                           device[item["label"]])
          for item, cfg in planned_analyses(ctx)}


ABLATION = "ablation_"   # the prefix of the ablation's stages in this pipeline


def ablation_config(config, workdir: Path) -> AblationConfig:
  """Guan et al.'s Tables 2-3 on the SQuAD model (`heads_jax.pipelines.ablation`), the types
  from the SQuAD model's analysis in this run (``analysis/squad``), into ``ablation/``."""
  model_dir = _resolve(config.squad_model or DEFAULT_SQUAD_MODEL, "config.squad_model")
  ab = config.ablation
  return AblationConfig(model=str(model_dir), data=config.eval_data or config.squad_data,
                        out=str(Path(workdir) / "ablation"),
                        analysis=str(Path(workdir) / "analysis" / "squad"), paper_tables=True,
                        max_examples=int(ab.max_examples) or None, max_length=int(ab.max_length),
                        doc_stride=int(ab.doc_stride), batch_size=int(ab.batch_size),
                        seed=int(config.seed), title="Guan et al. Tables 2-3 on the SQuAD model")


def _stage_report(ctx: engine.Context[GuanConfig]) -> dict:
  from heads_jax.report import ablation as rep
  from heads_jax.report import guan as guan_report
  config = ctx.config
  results = ctx.results["analysis"]
  analyses = {item["label"]: dict(results[item["label"]].to_json(), model=item["model"],
                                  data=item["data"]) for item in plan_models(config)}
  ablation = ctx.results[ABLATION + REPORT]   # ablation.json's content
  tables = pd.read_csv(ablation.outputs["files"]["paper_tables"])
  key = {"analysis": {k: results[k].finished for k in analyses},
         "ablation": ablation.finished}

  def fn():
    base = ablation.outputs["baseline"]
    settings = {"SQuAD model": config.squad_model, "SQuAD samples": config.samples,
                "clusters (K)": config.clusters, "seed": config.seed,
                "Tables 2-3 data": config.eval_data or config.squad_data,
                "unablated EM / F1": f"{100 * base['exact_match']:.2f} / {100 * base['f1']:.2f}"}
    res = guan_report.write_guan_report(
        ctx.workdir, analyses={k: v["out"] for k, v in analyses.items()},
        squad_model=str(config.squad_model or DEFAULT_SQUAD_MODEL), tables=tables,
        questions=base.get("n"), models={k: (v["model"], v["data"]) for k, v in analyses.items()},
        settings=settings, tables_section=rep.paper_tables_section(tables, model=str(config.squad_model)))
    ctx.sub("Guan et al.'s claims: " + ", ".join(
        f"{n} {verdict}" for verdict, n in res["verdicts"].items() if n) + f" ({res['claims']})")
    return {"report": str(res["report"]), "claims": str(res["claims"]),
            "table1": res["table1"], "verdicts": res["verdicts"]}

  return engine.run_unit(ctx, "report", "report", key, fn,
                         clean=(ctx.workdir / contract.REPORT_HTML,
                                ctx.workdir / guan_report.CLAIMS_CSV),
                         paths=("report", "claims")).outputs


@dataclasses.dataclass(frozen=True)
class GuanJob:
  """The guan job's one typed config (the engine's ``config``): configs/reproduce.py's guan
  preset (``settings``: its own stages' ``ctx.config``) and its ablation's (``ablation``, an
  `ablation.AblationJob`: the ablation stages' ``ctx.config``), each a stage's `engine.Stage.part`."""
  settings: GuanConfig
  ablation: AblationJob


def guan_job(config: GuanConfig, workdir, log=print) -> GuanJob:
  """The `GuanJob` of ``config`` in ``workdir`` (its ablation: `ablation_config`)."""
  return GuanJob(settings=config, ablation=ablation_job(ablation_config(config, workdir), log,
                                                         prefix=ABLATION, under="ablation"))


def pipeline_stages(job: GuanJob) -> tuple[engine.Stage[GuanJob], ...]:
  """The analyses' two stages, the ablation's stages (`ablation.ablation_stages`, prefixed
  ``ablation_``: its unablated baseline, Tables 2-3, its report) and the report."""
  ablation = ablation_stages(job.ablation, part="ablation")
  return (
      engine.Stage("scores", "the device pass (distance features, sieve bias) of each model",
                   _stage_scores, outputs=("analysis",), part="settings"),
      engine.Stage("analysis", "K-means clusters, tests and report of each model (host)",
                   _stage_analysis, reads=("scores",), part="settings"),
      *ablation,
      engine.Stage("report", "report beside the paper's values", _stage_report,
                   reads=("analysis", ablation[-1].name),
                   outputs=(contract.REPORT_HTML, "figures"), part="settings"),
  )


def run_guan(config: GuanConfig, workdir, *, redo: str | None = None, log=print) -> dict:
  """Runs the Guan et al. pipeline (module docstring) in ``workdir``; returns each stage's
  result."""
  workdir = Path(workdir)
  log(f"heads-jax reproduce (guan): {config.squad_model} in {workdir}")
  job = guan_job(config, workdir, log)
  return engine.run_pipeline(
      pipeline_stages(job), workdir, config=job, redo=redo, log=log,
      what="heads-jax reproduce (guan)",
      claim={"kind": "reproduce", "flag": "--workdir", "model": config.squad_model or None,
             "data": [config.squad_data], "settings": {"preset": config.preset}})
