"""Write a tiny random model of one family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT, ModernBERT, DeBERTa-v3) into a new directory, offline: a model to try the commands on for each family (its scores are noise).

Thin entry point over ``heads_jax.model.tiny.write_tiny_model``.

  heads-jax tiny-model --family modernbert runs/tiny-modernbert
  heads-jax analyze --model runs/tiny-modernbert --data ud-ewt --max-examples 16 --out runs/tiny-modernbert-analysis
"""

from __future__ import annotations

from heads_jax.model.tiny import TINY_FAMILIES  # light: no JAX for --help


def add_args(p):
  p.add_argument("out", help="a new directory for the model")
  p.add_argument("--family", required=True, choices=TINY_FAMILIES, help="the model family")
  p.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0)")


def check(args):
  """An existing non-empty --out is refused before JAX starts (the model is never written over
  another directory's files)."""
  from pathlib import Path
  from heads_jax.errors import UserError
  out = Path(args.out)
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise UserError(f"{out} exists and is not an empty directory; give a new directory")


def main(args):
  from heads_jax.model.tiny import write_tiny_model
  out = write_tiny_model(args.family, args.out, seed=args.seed)
  print(f"wrote a tiny random {args.family} model (random weights: its scores are noise) to "
        f"{out}; try: heads-jax analyze --model {out} --data ud-ewt --max-examples 16 "
        f"--out {out}-analysis")
