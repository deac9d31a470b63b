"""Guan et al. 2020 ("How far does BERT look at", COLING) in one command:
``heads-jax reproduce --config configs/reproduce.py:guan --workdir DIR``.

Stages (on the stage engine, `heads_jax.pipelines.engine`: a rerun reuses every finished unit
whose settings and inputs did not change; ``--redo STAGE`` reruns one and what reads it):

1. ``analysis``: the SQuAD model (``config.squad_model``: a path or a hub id, default
   ``bert-large-uncased-whole-word-masking-finetuned-squad``, resolved through
   `heads_jax.hub`'s cache) analysed on ``config.samples`` random SQuAD questions ("the distance
   features are averaged over 1,000 SQuAD samples"), clustered into ``config.clusters`` = 4
   types (Figs. 1-3 and 5 in its analysis report); then each further model of
   ``config.models`` (``pretrained``, ``mrpc``, ``mnli``: a path or hub id each, "" to leave it
   out) on its data (``config.model_data``; the pre-trained model on the same SQuAD samples), for
   Table 1 (the stability of each model's clustering) and Fig. 4 (the types per layer of every
   model).
2. ``ablation``: Tables 2 and 3 row by row on the SQuAD model (`heads_jax.ablation.guan`, scored
   in exact match and F1 on ``config.eval_data``, the SQuAD v1.1 dev set in the paper), the types
   from the SQuAD model's clustering.
3. ``report``: ``DIR/report.html``: Table 1 and Tables 2-3 beside the paper's values
   (`heads_jax.hoststats.paper`), Fig. 4, and links to each analysis report.

Outputs: ``DIR/analysis/<label>/`` (analysis directories), ``DIR/ablation/`` (the ablate
outputs, ``paper_tables.csv``), ``DIR/report.html``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from heads_jax import contract, hub
from heads_jax.errors import UserError
from heads_jax.hoststats import paper
from heads_jax.pipelines import engine
from heads_jax.pipelines.ablate import AblationConfig, run_ablation
from heads_jax.pipelines.analyze import AnalysisConfig
from heads_jax.pipelines import stages
from heads_jax.pipelines.keys import ANALYSIS_PATHS, unit_key
from heads_jax.report.figures import guan as guan_figures
from heads_jax.report.page import esc, figure_html, table_html, write_page

DEFAULT_SQUAD_MODEL = "bert-large-uncased-whole-word-masking-finetuned-squad"
STAGES = ("analysis", "ablation", "report")
MODEL_LABELS = ("squad", "pretrained", "mrpc", "mnli")   # Table 1's columns, SQuAD first
PAPER_LABELS = {"pretrained": "Pre-train", "squad": "SQuAD", "mrpc": "MRPC", "mnli": "MNLI"}


def _resolve(name: str, what: str) -> Path:
  """A model path or hub id as a local directory (the hub's cache; one line when absent)."""
  try:
    return hub.model_path(str(name))
  except FileNotFoundError:
    raise UserError(f"{what} {name!r} is neither an existing path nor a Hugging Face hub "
                    "id") from None


def _squad_sample_spec(data: str, samples: int, seed: int) -> str:
  """``data`` (a ``squad:`` / ``squad-tfds:`` spec) with ``:n=samples:seed=seed``."""
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


def _stage_analysis(ctx: engine.Context) -> dict:
  """``{label: `stages.Analysis`}`` of each model of the plan."""
  config = ctx.config
  out = {}
  for item in plan_models(config):
    model_dir = _resolve(item["model"], f"config.models.{item['label']}"
                         if item["label"] != "squad" else "config.squad_model")
    cfg = _analysis_config(config, item, model_dir, ctx.workdir / "analysis" / item["label"])
    ctx.sub(f"the {item['label']} model {item['model']} on {item['data']}")
    out[item["label"]] = stages.analysis(ctx, "analysis", item["label"], cfg,
                                         model=ctx.model(item["model"]))
  return out


def _stage_ablation(ctx: engine.Context) -> dict:
  config = ctx.config
  squad: stages.Analysis = ctx.results["analysis"]["squad"]
  model_dir = _resolve(config.squad_model or DEFAULT_SQUAD_MODEL, "config.squad_model")
  target = ctx.workdir / "ablation"
  ab = config.ablation
  eval_data = config.eval_data or config.squad_data
  acfg = AblationConfig(model=str(model_dir), data=eval_data, out=str(target),
                        analysis=squad.out, paper_tables=True,
                        max_examples=int(ab.max_examples) or None, max_length=int(ab.max_length),
                        doc_stride=int(ab.doc_stride),
                        batch_size=int(ab.batch_size), seed=int(config.seed),
                        title="Guan et al. Tables 2-3 on the SQuAD model")
  key = unit_key(dataclasses.asdict(acfg), paths=ANALYSIS_PATHS + ("analysis",),
                 inputs={"analysis": squad.finished, "data": ctx.data(eval_data),
                         "model": ctx.model(config.squad_model or DEFAULT_SQUAD_MODEL)})

  def fn():
    ctx.sub(f"Tables 2-3 on {eval_data}")
    res = run_ablation(acfg, log=ctx.sub)
    return {"out": str(target), "baseline": res["baseline"],
            "paper_tables": res["files"]["paper_tables"]}

  r = engine.run_unit(ctx, "ablation", "squad", key, fn, clean=(target,))
  return dict(r.outputs, finished=r.finished)


def table1(analyses: dict) -> pd.DataFrame:
  """Table 1: the stability of each model's clustering, this run's beside the paper's."""
  paper_values = {c.key.replace("guan_stability_", ""): c.value for c in paper.CLAIMS
                  if c.key.startswith("guan_stability_") and c.value is not None}
  rows = []
  for label in MODEL_LABELS:
    mine = analyses.get(label, {}).get("stability")
    rows.append({"model": PAPER_LABELS[label],
                 "this run": None if mine is None else 100 * float(mine),
                 "paper": 100 * paper_values.get(PAPER_LABELS[label].lower().replace("-", ""),
                                                 float("nan")),
                 "analysed": label in analyses})
  return pd.DataFrame(rows)


def _fig4(analyses: dict, fig_dir: Path) -> str:
  """Fig. 4: the types per layer of every analysed model (one panel each)."""
  html = ""
  for label in MODEL_LABELS:
    if label not in analyses:
      continue
    df = pd.read_csv(Path(analyses[label]["out"]) / contract.CLUSTERS_CSV)
    path = guan_figures.plot_cluster_layers(df, fig_dir / f"fig4_{label}.png",
                                            title=f"{PAPER_LABELS[label]} model")
    html += figure_html(path, f"Fig. 4 ({PAPER_LABELS[label]})",
                        f"Attention types per layer of the {PAPER_LABELS[label]} model "
                        f"({esc(analyses[label]['model'])}; Guan et al. Fig. 4: \"all the four "
                        "models share similar head type distribution\").")
  return html


def _stage_report(ctx: engine.Context) -> dict:
  from heads_jax.report import ablation as rep
  config = ctx.config
  results = ctx.results["analysis"]
  analyses = {item["label"]: dict(results[item["label"]].to_json(), model=item["model"],
                                  data=item["data"]) for item in plan_models(config)}
  ablation = ctx.results["ablation"]
  tables = pd.read_csv(ablation["paper_tables"])
  key = {"analysis": {k: results[k].finished for k in analyses},
         "ablation": ablation["finished"]}

  def fn():
    t1 = table1(analyses)
    def rel(v):
      return esc(Path(v["out"]).relative_to(ctx.workdir).as_posix())
    links = "".join(f'<li>{esc(PAPER_LABELS[k])}: <a href="{rel(v)}/{contract.REPORT_HTML}">'
                    f'analysis report</a> ({esc(v["model"])} on {esc(v["data"])}; Figs. 1-3 '
                    'and 5)</li>' for k, v in analyses.items())
    sections = [
        {"title": "Analyses", "html": f"<ul>{links}</ul>"},
        {"title": "Table 1: stability of the clustering",
         "html": ("<p>Share of heads (percent) whose cluster is the same in every fit on random "
                  "halves (Von Luxburg 2010, as Guan et al.), per model; the paper's values are "
                  "BERT-large's. Models this run did not analyse are blank.</p>"
                  + table_html(t1, table_id="table-guan-table1", float_format="{:.2f}"))},
        {"title": "Fig. 4: attention types per layer, per model",
         "html": _fig4(analyses, ctx.workdir / "figures")},
        rep.paper_tables_section(tables, model=str(config.squad_model)),
    ]
    base = ablation["baseline"]
    settings = {"SQuAD model": config.squad_model, "SQuAD samples": config.samples,
                "clusters (K)": config.clusters, "seed": config.seed,
                "Tables 2-3 data": config.eval_data or config.squad_data,
                "unablated EM / F1": f"{100 * base['exact_match']:.2f} / {100 * base['f1']:.2f}"}
    page = write_page(ctx.workdir, title="Guan et al. 2020: how far does BERT look at",
                      sections=sections, settings=settings,
                      subtitle=f"{paper.GUAN}; this run: {config.squad_model}")
    return {"report": str(page), "table1": t1.to_dict(orient="records")}

  return engine.run_unit(ctx, "report", "report", key, fn,
                         clean=(ctx.workdir / contract.REPORT_HTML,)).outputs


def pipeline_stages() -> tuple[engine.Stage, ...]:
  return (
      engine.Stage("analysis", "analyses (distance features, K-means clusters) of each model",
                   _stage_analysis, outputs=("analysis",)),
      engine.Stage("ablation", "Guan et al. Tables 2-3 on the SQuAD model (EM/F1)",
                   _stage_ablation, reads=("analysis",), outputs=("ablation",)),
      engine.Stage("report", "report beside the paper's values", _stage_report,
                   reads=("analysis", "ablation"), outputs=(contract.REPORT_HTML, "figures")),
  )


def run_guan(config, workdir, *, redo: str | None = None, log=print) -> dict:
  """Runs the Guan et al. pipeline (module docstring) in ``workdir``; returns each stage's
  result."""
  workdir = Path(workdir)
  log(f"heads-jax reproduce (guan): {config.squad_model} in {workdir}")
  return engine.run_pipeline(
      pipeline_stages(), workdir, config=config, redo=redo, log=log,
      what="heads-jax reproduce (guan)",
      claim={"kind": "reproduce", "flag": "--workdir", "model": config.squad_model or None,
             "data": [config.squad_data], "settings": {"preset": config.preset}})
