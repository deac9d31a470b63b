"""Ablate attention heads of a fine-tuned classifier: groups, intra/inter attention, importance, pruning.

Evaluates the classifier on its GLUE dev set with groups of heads removed (gate 0) or replaced
by uniform attention (--by cluster|role|layer|heads; Guan et al. 2020 Table 2), with the
intra- or inter-sentence attention of chosen heads removed (--cross; Guan et al. Table 3), and
computes head importance and the pruning curve (--importance, --prune; Michel et al. 2019).
Each ablation is compared with random groups of the same size. Writes into --out: ablation.csv,
segment_ablation.csv, importance.csv, pruning.csv, pruning_summary.csv, ablation.json,
figures/*.png and report.html.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from heads_jax import runfiles
from heads_jax.ablation.guan import paper_tables
from heads_jax.ablation import ablate, causal, evaluate, groups as groups_lib, importance as imp_lib, pruning
from heads_jax.errors import UserError
from heads_jax.report import ablation as rep
from heads_jax.report.robustness import causal_html
from heads_jax.report.figures import guan, michel
from heads_jax.report.page import table_html, write_page


@dataclasses.dataclass
class AblationConfig:
  """What ``heads-jax ablate`` runs (its flags, one field each; see analyze/ablate.py for help)."""
  model: str
  data: str
  out: str
  task: str | None = None
  finetune_data: str | None = None
  analysis: str | None = None
  by: str | None = None              # cluster | role | layer | heads
  role_level: str = "coarse"         # coarse | fine
  mode: str = "remove"               # remove | uniform | mean
  random_groups: int = 30            # --by role: random groups of the same layers per role (causal test)
  heads: str | None = None           # 'L:H,L:H;NAME=L:H,...'
  cross: str | None = None           # intra | inter | both
  cluster: list | None = None
  paper_tables: bool = False         # Guan et al. Tables 2-3 row by row (needs --analysis)
  renormalise: bool = False
  importance: bool = False
  prune: bool = False
  prune_step: float = 0.1
  prune_max: float = 1.0
  prune_once: bool = False
  importance_per_batch: bool = False
  layer_norm: bool = True
  importance_data: str | None = None
  random_seeds: int = 3
  seed: int = 0
  max_examples: int | None = None
  max_length: int = 128
  doc_stride: int = 128             # SQuAD windows: stride over the context (run_squad.py's 128)
  batch_size: int = 64
  dtype: str | None = None
  title: str | None = None


@dataclasses.dataclass
class AblationRun:
  """What the sub-jobs share: the config, the evaluator of the unablated model and its scores,
  the report's settings, and the importance estimator (set by the importance sub-job, read by
  pruning)."""
  config: AblationConfig
  model: object
  tokenizer: object
  data: evaluate.EvalData
  ev: evaluate.Evaluator
  base: dict
  settings: dict
  fig_dir: Path
  log: Callable[[str], None]
  estimator: object = None

  @property
  def metrics(self) -> tuple[str, ...]:
    return self.data.metric_names

  @property
  def shown(self) -> list[str]:
    """The columns of a group table printed to the log."""
    return ["group", "num_heads", "ablation"] + [c for m in self.metrics for c in (
        m, f"{m}_change", f"random_{m}_change")]


@dataclasses.dataclass
class SubResult:
  """One sub-job's result: its tables (``{file stem: table}``, written as CSV; the first is the
  one ``files`` lists), arrays (``{file stem: array}``, .npy), the report section, what goes into
  ablation.json under the sub-job's name, and the lines it logs."""
  tables: dict
  section: dict
  record: object
  log_lines: list
  arrays: dict = dataclasses.field(default_factory=dict)


def _by_groups(run: AblationRun) -> SubResult:
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  groups = groups_lib.load_groups(config.by, num_layers=L, num_heads=H, analysis=config.analysis,
                                  heads=config.heads, role_level=config.role_level)
  table = ablate.ablate_groups(run.ev, groups, mode=config.mode, random_seeds=config.random_seeds,
                               seed=config.seed, base=run.base, log=run.log)
  fig = guan.plot_group_ablation(table, run.fig_dir / "ablation.png", metric=run.metrics[0])
  how = {"remove": "removed (gate 0)", "uniform": "given uniform attention over the real tokens",
         "mean": "replaced by their mean output over the data"}[config.mode]
  note = (f"Heads {how}; "
          f"groups by {config.by}" + (f" from {config.analysis}" if config.analysis else "") + ".")
  run.settings.update({"grouping": config.by, "ablation mode": config.mode})
  section = rep.ablation_section(table, fig, title=f"Ablation by {config.by}", note=note)
  tables, lines = {"ablation": table}, [f"\nablation by {config.by} ({config.mode}):",
                                        _table_text(table, run.shown)]
  if config.by == "role" and config.random_groups > 0:  # issue 26: the causal test of each role
    test = causal.causal_tests(causal.GroupEvaluator(run.ev, config.mode),
                               [g for g in groups if len(g)], random_groups=config.random_groups,
                               metric=run.metrics[0], seed=config.seed, base=run.base, log=run.log)
    tables["causal"] = test
    section["html"] += causal_html(test, run.fig_dir)
    lines += ["\ncausal test (role vs random groups of the same layers):",
              _table_text(test, ["group", "num_heads", "layers", "change", "random_mean_change",
                                 "rank", "p_value"])]
  return SubResult(tables, section, table.to_dict(orient="records"), lines)


def _cross_groups(run: AblationRun) -> list:
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  if config.cluster or (config.analysis and not config.heads):
    cgroups = groups_lib.load_groups("cluster", num_layers=L, num_heads=H, analysis=config.analysis)
    if config.cluster:
      known = [g.name for g in cgroups]
      bad = [c for c in config.cluster if c not in known]
      if bad:
        raise UserError(f"--cluster {bad} not in {config.analysis}/clusters.csv (types: {known})")
      cgroups = [g for g in cgroups if g.name in config.cluster]
    return cgroups
  if config.heads:
    return groups_lib.load_groups("heads", num_layers=L, num_heads=H, heads=config.heads)
  raise UserError("--cross needs the heads: --analysis DIR [--cluster TYPE] or --heads L:H,...")


def _segments(run: AblationRun) -> SubResult:
  config, data = run.config, run.data
  cgroups = _cross_groups(run)
  parts = ("intra", "inter") if config.cross == "both" else (config.cross,)
  if not data.task.is_pair:
    run.log(f"note: {data.task.name} has single sentences: all attention is intra-sentence, so "
            "removing it removes the heads' whole attention" + (", and inter removal changes nothing"
                                                                if "inter" in parts else ""))
  table = ablate.ablate_segments(run.ev, cgroups, parts=parts, renormalise=config.renormalise,
                                 random_seeds=config.random_seeds, seed=config.seed, base=run.base,
                                 log=run.log)
  fig = guan.plot_segment_ablation(table, run.fig_dir / "segment_ablation.png",
                                   metric=run.metrics[0])
  run.settings["intra/inter rows renormalised"] = bool(config.renormalise)
  return SubResult({"segment_ablation": table},
                   rep.segment_section(table, fig, metric=run.metrics[0]),
                   table.to_dict(orient="records"),
                   ["\nintra/inter-sentence attention removed ("
                    f"{'rows renormalised' if config.renormalise else 'rows not renormalised: Guan et al. do not say; heads_jax default'}):",
                    _table_text(table, run.shown)])


def _importance(run: AblationRun) -> SubResult:
  config, ev = run.config, run.ev
  src = ev
  if config.importance_data:
    idata = evaluate.load_eval_data(config.importance_data, run.tokenizer, task=run.data.task.name,
                                    max_length=config.max_length, max_examples=config.max_examples)
    src = evaluate.Evaluator(run.model, idata, batch_size=config.batch_size, mesh=ev.mesh)
  run.estimator = est = imp_lib.ImportanceEstimator(src, per_example=not config.importance_per_batch,
                                                    normalize_layers=config.layer_norm)
  raw = est.raw()
  imp = imp_lib.normalize_by_layer(raw) if config.layer_norm else raw
  table = rep.importance_table(imp, raw)
  imp_settings = {"gradient": "per example" if not config.importance_per_batch else "per batch (authors' code)",
                  "layer L2 normalisation": bool(config.layer_norm),
                  "estimated on": (src.data.name if src is not ev else run.data.name)}
  fig = michel.plot_importance(imp, run.fig_dir / "importance.png",
                               label="importance (layer-normalised)" if config.layer_norm else "E|dL/dgate|")
  top = table.sort_values("rank").head(5)
  return SubResult({"importance": table},
                   rep.importance_section(imp, fig, raw=raw, settings=imp_settings),
                   {"settings": imp_settings, "values": imp.tolist()},
                   ["\nmost important heads: " + ", ".join(
                       f"{l}:{h} ({v:.3g})" for l, h, v in zip(top["layer"], top["head"], top["importance"]))],
                   arrays={"importance": imp})


def _pruning(run: AblationRun) -> SubResult:
  config = run.config
  curve = pruning.pruning_curve(run.ev, run.estimator, step=config.prune_step,
                                max_share=config.prune_max, reestimate=not config.prune_once,
                                random_seeds=config.random_seeds, seed=config.seed, log=run.log)
  summary = pruning.curve_summary(curve, run.metrics)
  fig = michel.plot_pruning_curve(curve, run.fig_dir / "pruning.png")
  prune_settings = {"step": config.prune_step, "largest share": config.prune_max,
                    "importance re-estimated after each step": not config.prune_once,
                    "random orders": config.random_seeds}
  return SubResult({"pruning": curve, "pruning_summary": summary},
                   rep.pruning_section(curve, summary, fig, settings=prune_settings),
                   summary.to_dict(orient="records"),
                   ["\npruning curve:",
                    summary.to_string(index=False, float_format=lambda v: f"{v:.4f}")])


def _paper_tables(run: AblationRun) -> SubResult:
  """Guan et al. Tables 2 and 3 row by row (``heads_jax.ablation.guan``), the paper's beside."""
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  if not config.analysis:
    raise UserError("--paper-tables needs the cluster types: --analysis DIR (an analysis of this "
                    "model with clusters.csv)")
  cgroups = groups_lib.load_groups("cluster", num_layers=L, num_heads=H, analysis=config.analysis)
  table = paper_tables(run.ev, cgroups, base=run.base, log=run.log)
  return SubResult({"paper_tables": table},
                   rep.paper_tables_section(table, model=str(config.model)),
                   table.to_dict(orient="records"),
                   ["\nGuan et al. Tables 2-3 (this run vs the paper):",
                    _table_text(table, ["table", "id", "setting", *run.metrics,
                                        "paper_exact_match", "paper_f1"])])


@dataclasses.dataclass(frozen=True)
class SubJob:
  """One part of the ablate job: its name (the key in ablation.json and its ``files``), when
  the config asks for it, and what computes it."""
  name: str
  wanted: Callable[[AblationConfig], bool]
  run: Callable[[AblationRun], SubResult]


# In order; pruning reads the importance sub-job's estimator.
SUB_JOBS = (
    SubJob("ablation", lambda c: bool(c.by), _by_groups),
    SubJob("segment_ablation", lambda c: bool(c.cross), _segments),
    SubJob("importance", lambda c: bool(c.importance or c.prune), _importance),
    SubJob("pruning", lambda c: bool(c.prune), _pruning),
    SubJob("paper_tables", lambda c: bool(c.paper_tables), _paper_tables),
)


def _table_text(df, columns) -> str:
  cols = [c for c in columns if c in df.columns]
  return df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}")


def _load(config: AblationConfig):
  """``(model, tokenizer, data, evaluator)``: a GLUE classifier on GLUE data, or a SQuAD span
  model on ``squad:`` data (windows of ``--max-length``; exact match and F1)."""
  if evaluate.is_squad_spec(config.data):
    if config.importance or config.prune or config.finetune_data:
      raise UserError("--importance, --prune and --finetune-data are for GLUE classifiers; a "
                      "SQuAD model takes --by, --cross and --paper-tables")
    model, tokenizer = evaluate.load_span_model(config.model, dtype=config.dtype)
    model.config.check_max_length(config.max_length)
    data = evaluate.load_squad_eval_data(config.data, tokenizer, max_length=config.max_length,
                                         doc_stride=config.doc_stride,
                                         max_examples=config.max_examples)
    return model, tokenizer, data, evaluate.SquadEvaluator(model, data,
                                                           batch_size=config.batch_size)
  model, tokenizer = evaluate.load_classifier(config.model, dtype=config.dtype)
  model.config.check_max_length(config.max_length)
  rows = evaluate.eval_rows_from_finetune(config.finetune_data) if config.finetune_data else None
  data = evaluate.load_eval_data(config.data, tokenizer, task=config.task, max_length=config.max_length,
                                 max_examples=config.max_examples, rows=rows)
  return model, tokenizer, data, evaluate.Evaluator(model, data, batch_size=config.batch_size)


def classifier_task(model_dir) -> tuple[str | None, tuple[str, ...] | None]:
  """What a classifier directory says of the task it was fine-tuned on: ``(task, label
  names)``, from the fine-tuning run it was exported into (its job marker, `runfiles.JOB_FILE`,
  one folder up) and its ``id2label`` (heads_jax.json or a Hugging Face config.json; generic
  ``LABEL_i`` names say nothing). Either is None when unknown."""
  p = Path(str(model_dir))
  task = None
  if not str(model_dir).startswith(("gs://", "s3://")) and p.is_dir():
    job = runfiles.read_job(p.parent) if (p.parent / runfiles.JOB_FILE).is_file() else None
    if job and job.get("kind") == "finetuning":
      task = job.get("task")
    for name in ("heads_jax.json", "config.json"):
      doc = runfiles.read_json(p / name, missing_ok=True) if (p / name).is_file() else None
      id2label = (doc or {}).get("id2label") if isinstance(doc, dict) else None
      if id2label:
        names = tuple(str(id2label[k]) for k in sorted(id2label, key=lambda k: int(k)))
        if not all(n.upper() == f"LABEL_{i}" for i, n in enumerate(names)):
          return task, names
        break
  return task, None


def check_classifier_task(model_dir, task) -> None:
  """Refuses (UserError) a classifier fine-tuned on another task than the data's ``task`` (a
  `glue.GlueTask`), when the model directory says which (`classifier_task`); before any
  evaluation."""
  if getattr(task, "label_names", None) is None:
    return
  trained, names = classifier_task(model_dir)
  if trained is not None and trained != task.name:
    raise UserError(f"the classifier {model_dir} was fine-tuned on {trained}, but the data is "
                    f"{task.name}: its scores would mean nothing; pass --data of {trained}, or a "
                    f"classifier fine-tuned on {task.name}")
  if names is not None and task.label_names and names != tuple(task.label_names):
    raise UserError(f"the classifier {model_dir} predicts the labels {', '.join(names)}, but "
                    f"{task.name}'s labels are {', '.join(task.label_names)}: it was fine-tuned on "
                    "another task; pass --data of its task, or a classifier of this one")


def run_ablation(config: AblationConfig, log=print) -> dict:
  """Runs what ``config`` asks for; writes into ``config.out``; returns the paths and results."""
  if not (config.by or config.cross or config.importance or config.prune or config.paper_tables):
    raise UserError("nothing to do: ask for --by cluster|role|layer|heads, --cross intra|inter|both, "
                    "--importance and/or --prune")
  out = Path(config.out)
  runfiles.check_dir(out, "ablation", flag="--out")  # a file, another job's directory: refused
  t0 = time.time()
  model, tokenizer, data, ev = _load(config)
  check_classifier_task(config.model, data.task)
  runfiles.claim_dir(out, "ablation", model=config.model, data=config.data, task=data.task.name,
                     settings={"by": config.by, "cross": config.cross, "mode": config.mode,
                               "importance": config.importance, "prune": config.prune})
  L, H = ev.num_layers, ev.num_heads
  base = ev.evaluate()
  metrics = data.metric_names
  log(f"{data.task.name}: {len(data)} examples ({data.name}); {L} layers x {H} heads; unablated "
      + ", ".join(f"{m} {base[m]:.4f}" for m in metrics))
  settings = {"model": str(config.model), "data": config.data, "task": data.task.name,
              "evaluation set": data.name, "examples": len(data), "layers": L, "heads": H,
              "metrics": ", ".join(metrics), "random seeds": config.random_seeds, "seed": config.seed,
              "max length": config.max_length}
  results = {"settings": settings, "baseline": base, "files": {}}
  sections = [{"title": "Unablated model", "html": table_html(
      pd.DataFrame([{k: base[k] for k in (*metrics, "loss", "n") if k in base}]),
      table_id="table-baseline", float_format="{:.4f}")}]
  run = AblationRun(config, model, tokenizer, data, ev, base, settings, out / "figures", log)
  for job in SUB_JOBS:
    if not job.wanted(config):
      continue
    r = job.run(run)
    paths = [runfiles.write_table(out, stem, table) for stem, table in r.tables.items()]
    for stem, array in r.arrays.items():
      runfiles.write_array(out, stem, array)
    sections.append(r.section)
    results["files"][job.name] = str(paths[0])
    results[job.name] = r.record
    for line in r.log_lines:
      log(line)

  settings["seconds"] = round(time.time() - t0, 1)
  title = config.title or f"Head ablation: {Path(str(config.model)).name} on {data.task.name}"
  report = write_page(out, title=title, sections=sections, settings=settings,
                      subtitle=f"model: {config.model} | data: {data.name}")
  results["report"] = str(report)
  runfiles.write_ablation_json(out, results)
  log(f"\nreport: {report}")
  return results
