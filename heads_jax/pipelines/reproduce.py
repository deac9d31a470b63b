"""The reproduce job: Pande et al. (AAAI 2021) end to end, ``run_reproduce(config, workdir)``.

Stages (``STAGES``), each writing under ``workdir``:

1. ``data``: per task, the rows fine-tuning trains on, evaluates on and the analysis reads
   (`heads_jax.data.glue_splits`): ``data/splits.json`` says where each came from (split and row
   ranges; the rows of roles sharing a split are disjoint, checked here), the analysis rows are
   also written as ``data/<TASK>/analysis.tsv`` (a data spec the analysis reads); fine-tuning
   gets its rows in memory;
2. ``pretrained``: the pre-trained model (an existing model or pre-training run, pre-training
   phases 1 and 2, or a random model) -> ``pretrained/pretrained.json``;
3. ``finetune``: every task over the config's grid (``finetune/<task>/bs<B>_lr<LR>``), the best
   dev score per task kept (``finetune/<task>/best.json``); a finished grid point keeps its
   exports and drops its Orbax checkpoints unless ``finetune.keep_checkpoints``;
4. ``scores``: the device pass of every analysis: the pre-trained model on every task's
   analysis rows and each fine-tuned model on its own task's (``analysis/pretrained/<task>``,
   ``analysis/finetuned/<task>``; with ``analysis.syntax_fallback`` and no parser also on that
   data): scores.npz, keyed by the model, the rows and the device-side settings;
5. ``analysis``: the host statistics of each (tests, roles, clusters, its report), keyed by its
   device pass and the host settings: a ``tau`` change reruns these, not the device passes;
6. ``similarity``: with ``analysis.similarity_examples``, the attention similarity before/after
   per task (device, keyed by the two device passes);
7. ``compare``: before/after per task (``compare/<task>``; host);
8. ``report``: ``report.html``, ``paper_table.csv`` and ``results.json``
   (`heads_jax.report.reproduce`).

Restarts. Each stage is made of units (a task, a grid point, an analysis). A unit writes
``stages/<stage>/<unit>.started.json`` (its key: the settings and inputs it depends on) before it
runs and ``stages/<stage>/<unit>.json`` (key, outputs, times) last. A unit whose done marker has
the current key is skipped; a unit started with another key has its outputs removed first; a
unit started with the same key and not finished continues (fine-tuning resumes from its
checkpoints). The key is the one rule of `heads_jax.pipelines.keys` (settings minus cosmetic
fields and paths, plus the identity of the inputs): the data stage's holds the content of each
GLUE TSV split a task reads, the pre-trained model's the content of the model behind
``config.pretrained.path``, a fine-tuning's its config, the pre-trained model's finish time and
its train and eval rows (their split's content and row ranges), a device pass's its settings,
the finish time of the model it reads and the content of the rows it analyses, the host
statistics' their settings and the device pass's finish time. So an input replaced
behind the same path reruns exactly the units that read it, redoing a stage makes the later
stages that read it run again, and a changed setting redoes only what depends on it. The stage
kinds are `heads_jax.pipelines.stages`'s; later stages read earlier results through the engine
(``ctx.results``).
The whole run is under one lock and one claim of ``workdir`` (claimed after the lock).
``redo=STAGE`` (or ``"all"``) removes that stage's markers and outputs first. ``config.stop_after`` stops after a
stage. Each stage prints one line when it starts and one with its time when it ends.
"""

from __future__ import annotations

import time
from pathlib import Path

import ml_collections

from heads_jax.pipelines.analysis import AnalysisConfig, headline
from heads_jax.data import glue, glue_splits
from heads_jax.data.syntax import DEFAULT_PARSER, MissingParserError, load_parser
from heads_jax.errors import UserError
from heads_jax import contract, runfiles
from heads_jax.pipelines.engine import Context, Stage, minutes, run_pipeline, run_unit
from heads_jax.pipelines import names, stages
from heads_jax.runfiles import unit_file_name
from heads_jax.report.reproduce import write_reproduce_report
from heads_jax.training import configlib

# The job's one typed config: configs/reproduce.py's (every stage reads it as ctx.config, and
# derives each unit's typed settings from it: `analysis_config` -> AnalysisConfig,
# `finetune_config` -> configs/finetune.py's config).
ReproduceConfig = ml_collections.ConfigDict

STAGES = names.REPRODUCE
STAGE_TEXT = {
    "data": "splits per task (train / eval / analysis rows)",
    "pretrained": "the pre-trained model",
    "finetune": "fine-tuning grid per task, best dev score kept",
    "scores": "the device pass of every analysis: sieve bias, distance features, measures",
    "analysis": "tests, roles and clusters of the pre-trained and fine-tuned models (host)",
    "similarity": "attention similarity before/after per task (config.analysis.similarity_examples)",
    "compare": "before/after fine-tuning per task",
    "report": "report.html and the paper table",
}
ROLES = glue_splits.ROLES


# ------------------------------------------------------------------------------------------------
# stage 1: data


def task_list(config) -> tuple[str, ...]:
  tasks = tuple(t.strip().lower() for t in str(config.tasks).split(",") if t.strip())
  known = [t for t in glue.TASKS if t in config.data]   # the tasks the config has splits for
  bad = [t for t in tasks if t not in glue.TASKS or glue.task_info(t).name not in known]
  if not tasks or bad:
    raise UserError(f"config.tasks={config.tasks!r}: give a comma-separated subset of "
                    f"{', '.join(known)}")
  return tuple(dict.fromkeys(glue.task_info(t).name for t in tasks))


def resolve_source(config, task: str) -> str:
  """``tsv`` or ``tfds`` for ``task`` (``auto``: tsv when the GLUE folder holds its train split)."""
  td = config.data[task]
  if td.source not in ("auto", "tsv", "tfds"):
    raise UserError(f"config.data.{task}.source must be auto, tsv or tfds, got {td.source!r}")
  if td.source != "tfds" and not str(config.data.glue_dir or ""):
    raise UserError(f"config.data.glue_dir is not set (no $HEADS_JAX_GLUE_DIR, no shared/data/glue "
                    f"beside the checkout): give --config.data.glue_dir=DIR (GLUE TSV folders), "
                    f"or --config.data.{task}.source=tfds")
  return glue_splits.resolve_source(task, td.source, config.data.glue_dir, td.train)


def _load_split(config, task: str, source: str, split: str) -> list:
  d = config.data
  try:
    return glue_splits.load_split(task, split, source=source, glue_dir=d.glue_dir,
                                  tfds_data_dir=d.tfds_data_dir)
  except FileNotFoundError as e:
    info = glue.task_info(task)
    raise UserError(
        f"GLUE {info.dir_name} has no {split} split under {d.glue_dir} ({str(e).split(';')[0]}). "
        f"Use TFDS (--config.data.{task}.source=tfds, glue/{task} prepared) or name an existing "
        f"split for it (e.g. --config.data.{task}.train=dev with "
        f"--config.data.partition_shared_splits=True: fine-tune on a part of dev, evaluate on "
        f"the rest)") from None




def plan_task(config, task: str, split_rows: dict) -> dict:
  """Which rows of which split each role gets (`heads_jax.data.glue_splits.plan_rows` with the
  config's ``data`` settings): ``{role: (split, [positions])}``."""
  td, d = config.data[task], config.data
  return glue_splits.plan_rows(
      task, split_rows, {"train": td.train, "eval": td.eval, "analysis": td.analysis},
      test_sequences=int(config.test_sequences), eval_fraction=d.eval_fraction, seed=d.seed,
      max_eval=int(d.max_eval_examples), max_train=int(d.max_train_examples),
      partition_shared=bool(d.partition_shared_splits))


def materialize_task(config, task: str, out_root: Path) -> dict:
  """Loads the task's splits and cuts them (`plan_task`); writes the analysis rows as a GLUE TSV
  (``<TASK>/analysis.tsv``, the analysis reads it as a data spec) and returns where every role's
  rows come from (``roles``: split, row count, ``idx`` ranges; `task_rows` reads them back)."""
  info = glue.task_info(task)
  td = config.data[task]
  source = resolve_source(config, task)
  names = dict.fromkeys([td.train, td.eval, td.analysis])
  rows = {s: _load_split(config, task, source, s) for s in names}
  plan = plan_task(config, task, {s: len(r) for s, r in rows.items()})
  origin = (str(config.data.glue_dir) if source == "tsv"
            else f"tfds glue/{task} ({config.data.tfds_data_dir or 'default data dir'})")
  return glue_splits.cut_task(task, rows, plan, out_root / info.dir_name, source=source,
                              origin=origin)


def task_rows(config, task: str, data_outputs: dict) -> tuple[list, list, dict]:
  """``(train, eval, note)``: the fine-tuning rows the data stage planned (``data_outputs``: its
  unit's outputs), read again from their splits and passed in memory; ``note`` as
  `heads_jax.data.glue_splits.load_task_splits` gives it."""
  roles, source = data_outputs["roles"], data_outputs["source"]
  got = {}
  for role in ("train", "eval"):
    split = roles[role]["split"]
    got[role] = glue_splits.select_rows(_load_split(config, task, source, split),
                                        glue_splits.expand_ranges(roles[role]["idx"]))
  note = {"task": task, "source": source, "origin": data_outputs["origin"],
          "train_split": roles["train"]["split"], "eval_split": roles["eval"]["split"],
          "num_train": len(got["train"]), "num_eval": len(got["eval"]),
          "eval_idx": [e.idx for e in got["eval"]]}
  return got["train"], got["eval"], note


def split_files(ctx: Context[ReproduceConfig], config, task: str, source: str) -> dict:
  """``{split: content}`` of the splits ``task`` reads: each GLUE TSV's `fingerprint`; TFDS
  data by its name (a prepared TFDS dataset is versioned)."""
  td = config.data[task]
  out = {}
  for split in dict.fromkeys([td.train, td.eval, td.analysis]):
    if source == "tsv":
      try:
        out[split] = ctx.files(glue.tsv_path(config.data.glue_dir, task, split))
      except FileNotFoundError:
        out[split] = None  # the data stage says so
    else:
      out[split] = f"tfds glue/{task} {split}"
  return out


def stage_data(ctx: Context[ReproduceConfig]) -> dict:
  config = ctx.config
  runfiles.write_reproduce_config(ctx.workdir, config.to_dict())  # under the lock and claim
  root = ctx.workdir / "data"
  tasks = {}
  for task in ctx.tasks:
    d = config.data
    source = resolve_source(config, task)
    key = {"task": dict(config.data[task].to_dict()), "source": source,
           "files": split_files(ctx, config, task, source),
           "partition": bool(d.partition_shared_splits),
           "eval_fraction": d.eval_fraction, "max_train": d.max_train_examples,
           "max_eval": d.max_eval_examples, "seed": d.seed, "n": int(config.test_sequences)}
    info = glue.task_info(task)
    m = run_unit(ctx, "data", task, key, lambda t=task: materialize_task(config, t, root),
                 clean=[root / info.dir_name], paths=("dir", "roles.*.file"))
    tasks[task] = dict(m.outputs, files=key["files"])
    ctx.sub(f"{info.dir_name}: {m.outputs['describe']}")
  runfiles.write_splits(ctx.workdir, tasks)
  return tasks


# ------------------------------------------------------------------------------------------------
# stage 2: the pre-trained model


def pretrain_configs(pc) -> list:
  """The pre-training phases' configs (``config.pretrained``: phase 1, then phase 2 if set)."""
  overrides = [o.strip() for o in str(pc.pretrain_overrides).split(";") if o.strip()]
  return [configlib.load_config(name, overrides)
          for name in (pc.pretrain_config, pc.pretrain_phase2_config) if name]


def stage_pretrained(ctx: Context[ReproduceConfig]) -> stages.Pretrained:
  pc = ctx.config.pretrained
  m = stages.pretrained(ctx, "pretrained", "model", kind=pc.kind, out=ctx.workdir / "pretrained",
                        path=pc.path, size=pc.size, seed=int(ctx.config.seed),
                        configs=pretrain_configs(pc) if pc.kind == "pretrain" else ())
  runfiles.write_pretrained(ctx.workdir, m.to_json())
  ctx.sub(f"{m.what}: {m.model}")
  return m


# ------------------------------------------------------------------------------------------------
# stage 3: fine-tuning


def grid(config) -> list[tuple[int, float]]:
  f = config.finetune
  return [(int(b), float(lr)) for b in f.batch_sizes for lr in f.learning_rates]


def run_name(batch_size: int, lr: float) -> str:
  return f"bs{batch_size}_lr{lr:g}"


def finetune_config(config, task: str, batch_size: int, lr: float, init: str):
  """The `configs/finetune.py` config of one grid point: the preset ``config.finetune.preset``
  of ``task`` with ``config.finetune.overrides`` (a nested block of its fields) and the grid
  point's settings over it. Its rows come in memory (`task_rows`), so its ``data`` block names
  where they come from (``data.max_seq_length`` is the task's)."""
  td = config.data[task]
  point = {"task": task, "init_checkpoint": init, "seed": int(config.seed),
           "batch_size": int(batch_size), "tensorboard": False,
           "optimizer": {"learning_rate": float(lr)},
           "data": {"source": resolve_source(config, task), "glue_dir": str(config.data.glue_dir),
                    "tfds_data_dir": config.data.tfds_data_dir, "train_split": td.train,
                    "eval_split": td.eval, "holdout_fraction": 0.0, "max_examples": 0,
                    "max_seq_length": int(td.max_seq_length)}}
  return stages.preset("finetune.py:" + config.finetune.preset.format(task=task),
                       config.finetune.overrides, point, where="config.finetune.overrides")


def rows_key(task_data: dict, role: str) -> dict:
  """What identifies the rows of ``role`` (``task_data``: the data stage's result for the task):
  the content of their split, the split and the row ranges (not when they were written, so a
  new analysis size leaves fine-tuning on unchanged rows alone)."""
  r = task_data["roles"][role]
  return {"split": r["split"], "idx": r["idx"], "content": task_data["files"][r["split"]]}


def majority_share(rows) -> dict:
  """``{"majority": share of the most frequent label, "n": rows}`` of the evaluation rows the
  best dev score was measured on: the bar a classifier must beat for a fine-tuning verdict
  (`heads_jax.hoststats.claims.beats_majority`); majority None for a regression task."""
  labels = [r.label for r in rows if r.label is not None]
  if not labels or any(isinstance(x, float) and not float(x).is_integer() for x in labels):
    return {"majority": None, "n": len(labels)}
  counts: dict = {}
  for x in labels:
    counts[x] = counts.get(x, 0) + 1
  return {"majority": max(counts.values()) / len(labels), "n": len(labels)}


def pick_best(results: dict) -> tuple[str, object]:
  """The grid point with the highest best-dev score (first one on ties): ``(name, result)``."""
  if not results:
    raise ValueError("no fine-tuning runs to choose from")
  score = lambda r: r["score"] if isinstance(r, dict) else r.score  # noqa: E731
  name = max(results, key=lambda k: (score(results[k]), -list(results).index(k)))
  return name, results[name]


def stage_finetune(ctx: Context[ReproduceConfig]) -> dict:
  """``{task: the best grid point's `stages.Finetuned`}``; ``finetune/<task>/best.json`` says
  which and the grid's scores."""
  config = ctx.config
  pre: stages.Pretrained = ctx.results["pretrained"]
  out = {}
  for task in ctx.tasks:
    task_data = ctx.results["data"][task]
    results = {}
    for bs, lr in grid(config):
      name = run_name(bs, lr)
      c = finetune_config(config, task, bs, lr, pre.model)
      inputs = {"pretrained": pre.finished, "train": rows_key(task_data, "train"),
                "eval": rows_key(task_data, "eval")}
      results[name] = stages.finetune(
          ctx, "finetune", f"{task}/{name}", c, ctx.workdir / "finetune" / task / name,
          inputs=inputs, rows=lambda t=task, d=task_data: task_rows(config, t, d),
          keep_checkpoints=bool(config.finetune.keep_checkpoints),
          note=f"{task} {name}: {c.num_train_steps} steps of {c.batch_size} x "
               f"{c.data.max_seq_length}, lr {c.optimizer.learning_rate:g}")
    best_name, best = pick_best(results)
    runfiles.write_best(ctx.workdir, task, {
        "task": task, "best_run": best_name, "model": best.model, "metric": best.metric,
        "score": best.score, "best": best.best,
        "eval_labels": majority_share(task_rows(config, task, task_data)[1]),
        "grid": {k: {"batch_size": v.batch_size, "learning_rate": v.learning_rate,
                     "score": v.score, "metric": v.metric} for k, v in results.items()},
        "finished": {k: v.finished for k, v in results.items()}})
    out[task] = best
    pts = ", ".join(f"{k} {v.metric} {100 * v.score:.1f}" for k, v in results.items())
    ctx.sub(f"{task}: best {best_name} ({best.metric} {100 * best.score:.1f}); grid: {pts}")
  return out


# ------------------------------------------------------------------------------------------------
# stage 4: analysis


def available_parser(name: str) -> str:
  """``"auto"`` -> ``en_core_web_sm`` when installed, else ``"none"``; other names as given (a
  missing pipeline fails when the analysis loads it)."""
  if name != "auto":
    return name
  try:
    load_parser(DEFAULT_PARSER)
    return DEFAULT_PARSER
  except MissingParserError:
    return "none"


def analysis_units(ctx: Context[ReproduceConfig], parser: str) -> list[dict]:
  """Every analysis of the run: ``{"unit", "model_kind", "task", "data", "out", "model",
  "model_id"}`` (``model_id``: the finish time of the unit that wrote the model)."""
  config = ctx.config
  n = int(config.test_sequences)
  pre: stages.Pretrained = ctx.results["pretrained"]
  best: dict = ctx.results["finetune"]
  root = ctx.workdir / "analysis"
  units = []
  for task in ctx.tasks:
    info = glue.task_info(task)
    spec = f"glue-tsv:{ctx.workdir / 'data' / info.dir_name}:analysis"
    units.append({"unit": f"pretrained/{task}", "model_kind": "pretrained", "task": task,
                  "data": spec, "model": pre.model, "model_id": pre.finished,
                  "out": str(root / "pretrained" / task)})
    units.append({"unit": f"finetuned/{task}", "model_kind": "finetuned", "task": task,
                  "data": spec, "model": best[task].model, "model_id": best[task].finished,
                  "out": str(root / "finetuned" / task)})
  fallback = config.analysis.syntax_fallback
  if fallback and parser == "none":
    slug = unit_file_name(fallback)
    units.append({"unit": f"pretrained/{slug}", "model_kind": "pretrained", "task": None,
                  "data": fallback, "model": pre.model, "model_id": pre.finished,
                  "out": str(root / "pretrained" / slug), "syntax_fallback": True})
    for task in ctx.tasks:
      units.append({"unit": f"finetuned/{task}-{slug}", "model_kind": "finetuned", "task": task,
                    "data": fallback, "model": best[task].model, "model_id": best[task].finished,
                    "out": str(root / "finetuned" / f"{task}-{slug}"), "syntax_fallback": True})
  for u in units:
    u["max_examples"] = n
  return units


def analysis_config(config, unit: dict, parser: str) -> AnalysisConfig:
  """``config.analysis`` (`AnalysisConfig.from_config`) for one analysis unit."""
  gold = unit.get("syntax_fallback", False)
  name = unit["task"] and glue.task_info(unit["task"]).dir_name
  what = ("pre-trained model" if unit["model_kind"] == "pretrained"
          else f"model fine-tuned on {name}")
  return AnalysisConfig.from_config(
      config.analysis, model=str(unit["model"]), data=(unit["data"],), out=unit["out"],
      max_examples=unit["max_examples"], syntax=gold or parser != "none", parser=parser or None,
      seed=int(config.seed), title=f"Attention heads of the {what} on {unit['data'].split('/')[-1]}")


def planned_analyses(ctx: Context[ReproduceConfig]) -> list[tuple[dict, AnalysisConfig]]:
  """Every analysis of the run with its settings: ``[(unit, AnalysisConfig)]``
  (`analysis_units`, `analysis_config`)."""
  parser = available_parser(ctx.config.analysis.parser)
  return [(u, analysis_config(ctx.config, u, parser)) for u in analysis_units(ctx, parser)]


def stage_scores(ctx: Context[ReproduceConfig]) -> dict:
  """``{unit: `stages.Scores`}``: the device pass of every analysis (keyed by its model's
  finish time, its data's content and the device-side settings)."""
  plan = planned_analyses(ctx)
  if plan and not plan[0][1].syntax:
    fb = ctx.config.analysis.syntax_fallback
    ctx.sub("no dependency parser: the GLUE sequences are analysed without syntactic roles"
            + (f"; the syntactic roles come from {fb} (gold arcs)" if fb else ""))
  out = {}
  for u, cfg in plan:
    ctx.sub(f"{u['unit']}: {u['max_examples']} sequences of {u['data']}")
    out[u["unit"]] = stages.scores(ctx, "scores", u["unit"], cfg, model=u["model_id"],
                                   log=lambda m: None)
  return out


def stage_analysis(ctx: Context[ReproduceConfig]) -> dict:
  """``{unit: `stages.Analysis`}``: the host statistics of every analysis (keyed by its device
  pass and the host settings: a ``tau`` change reruns these only); ``analysis/analyses.json``
  lists them for the report."""
  device = ctx.results["scores"]
  plan = planned_analyses(ctx)
  out, listed = {}, {"parser": plan[0][1].parser if plan else None, "units": {}}
  for u, cfg in plan:
    a = stages.statistics(ctx, "analysis", u["unit"], cfg, device[u["unit"]], log=lambda m: None)
    if a.summary is not None:
      ctx.sub(f"{u['unit']}: " + headline(a.summary))
    out[u["unit"]] = a
    listed["units"][u["unit"]] = dict({k: v for k, v in u.items() if k != "model_id"},
                                      finished=a.finished)
  runfiles.write_analyses(ctx.workdir, listed)
  return out


# ------------------------------------------------------------------------------------------------
# stage 5: comparison


def stage_similarity(ctx: Context[ReproduceConfig]) -> dict:
  """``{task: `stages.Similarity`}`` of the pre-trained and fine-tuned models on the task's
  analysis rows (``config.analysis.similarity_examples`` > 0; keyed by their device passes)."""
  device = ctx.results["scores"]
  sim = int(ctx.config.analysis.similarity_examples)
  out = {}
  for task in ctx.tasks if sim > 0 else ():
    before, after = device[f"pretrained/{task}"], device[f"finetuned/{task}"]
    out[task] = stages.similarity(
        ctx, "similarity", task, ctx.workdir / "compare" / task, before_model=before.model,
        after_model=after.model, data=after.data[0], max_examples=sim,
        max_length=int(ctx.config.analysis.max_length),
        inputs={"before": before.finished, "after": after.finished}, log=lambda m: None)
  return out


def stage_compare(ctx: Context[ReproduceConfig]) -> dict:
  """``{task: `stages.Comparison`}`` of the pre-trained and fine-tuned analyses of each task
  (tables and report; host)."""
  analyses = ctx.results["analysis"]
  out = {}
  for task in ctx.tasks:
    name = glue.task_info(task).dir_name
    before, after = analyses[f"pretrained/{task}"], analyses[f"finetuned/{task}"]
    dest = ctx.workdir / "compare" / task
    quiet = (lambda m, t=task: ctx.sub(f"{t}: {m}") if m.startswith("heads that") else None)
    done = stages.comparison(ctx, "compare", f"{task}/comparison", before.out, after.out, dest,
                             inputs={"before": before.finished, "after": after.finished},
                             log=quiet)
    out[task] = stages.compare_report(
        ctx, "compare", f"{task}/report", before.out, after.out, done,
        title=f"{name}: pre-trained vs fine-tuned on {name}",
        similarity=ctx.results["similarity"].get(task), log=quiet)
  return out


# ------------------------------------------------------------------------------------------------
# stage 6: report


def stage_report(ctx: Context[ReproduceConfig]) -> dict:
  key = {"inputs": {s: ctx.finished.get(s) for s in STAGES[:-1]}, "tasks": list(ctx.tasks)}

  def fn():
    return write_reproduce_report(ctx.workdir, config=ctx.config.to_dict(), tasks=ctx.tasks)
  return run_unit(ctx, "report", "report", key, fn, clean=[],
                  paths=("report", "paper_table", "results")).outputs


# The pipeline: each stage, what it reads (the ``redo`` cascade) and the outputs ``redo`` removes
# (relative to the workdir).
PIPELINE = (
    Stage("data", STAGE_TEXT["data"], stage_data, outputs=("data",)),
    Stage("pretrained", STAGE_TEXT["pretrained"], stage_pretrained, outputs=("pretrained",)),
    Stage("finetune", STAGE_TEXT["finetune"], stage_finetune, reads=("data", "pretrained"),
          outputs=("finetune",)),
    Stage("scores", STAGE_TEXT["scores"], stage_scores,
          reads=("data", "pretrained", "finetune"), outputs=("analysis",)),
    Stage("analysis", STAGE_TEXT["analysis"], stage_analysis, reads=("scores",)),
    Stage("similarity", STAGE_TEXT["similarity"], stage_similarity, reads=("scores",)),
    Stage("compare", STAGE_TEXT["compare"], stage_compare, reads=("analysis", "similarity"),
          outputs=("compare",)),
    Stage("report", STAGE_TEXT["report"], stage_report, reads=STAGES[:-1],
          outputs=(contract.REPORT_HTML, "paper_table.csv", "results.json", "report_figures")),
)
assert tuple(s.name for s in PIPELINE) == STAGES


def run_reproduce(config: ReproduceConfig, workdir, *, redo: str | None = None, log=print) -> dict:
  """Runs (or continues) the reproduction in ``workdir``; returns ``{stage: its result}`` (the
  report stage's holds ``report``, the path of ``report.html``)."""
  workdir = Path(workdir).absolute()
  if redo is not None and redo not in STAGES + ("all",):
    raise UserError(f"--redo {redo!r}: one of {', '.join(STAGES)} (or all)")
  if config.stop_after and config.stop_after not in STAGES:
    raise UserError(f"config.stop_after={config.stop_after!r}: one of {', '.join(STAGES)} (or empty)")
  tasks = task_list(config)
  if config.pretrained.kind == "init":
    stages.resolve_model_path(config.pretrained.path)  # a missing model fails now, not after stage 1
  if config.analysis.parser not in ("auto", "none", ""):
    load_parser(config.analysis.parser)  # a missing spaCy pipeline: one line now, not after fine-tuning
  for task in tasks:  # every grid point's training settings: refused now, before any device work
    for bs, lr in grid(config):
      configlib.check_training_config(finetune_config(config, task, bs, lr, ""))
  t_all = time.time()
  log(f"heads-jax reproduce ({config.preset or 'custom'}): {', '.join(tasks)} in {workdir}")
  results = run_pipeline(PIPELINE, workdir, config=config, tasks=tasks, redo=redo,
                         stop_after=config.stop_after or None, log=log,
                         what="heads-jax reproduce",
                         claim={"kind": "reproduce", "flag": "--workdir",
                                "model": config.pretrained.path or None, "data": list(tasks),
                                "settings": {"preset": config.preset}})
  if "report" in results:
    log(f"done in {minutes(time.time() - t_all)}; report: {results['report']['report']}")
  return results
