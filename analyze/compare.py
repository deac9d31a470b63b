"""Compare two analyses (before/after fine-tuning, or two models) on the same data.

Writes compare_sieve_bias.csv, compare_roles.csv, compare_clusters.csv, compare.json, figures and
report.html into --out (and, with --before-model/--after-model, the per-head attention similarity
of Kovaleva et al. 2019). Thin entry point over ``heads_jax.pipelines.compare.run_compare``.
"""

from __future__ import annotations
from heads_jax.cli import add_redo
from heads_jax.pipelines import names


def add_args(p):
  p.add_argument("--before", required=True, help="analysis output directory of the first model (e.g. pre-trained)")
  p.add_argument("--after", required=True, help="analysis output directory of the second model (e.g. fine-tuned)")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--title", default=None, help="report title")
  p.add_argument("--before-model", default=None, metavar="PATH",
                 help="the first model (e.g. pre-trained): with --after-model, add the per-head "
                      "attention similarity before/after fine-tuning (Kovaleva et al. 2019)")
  p.add_argument("--after-model", default=None, metavar="PATH", help="the second model (e.g. fine-tuned)")
  p.add_argument("--data", default=None, metavar="SPEC",
                 help="inputs for the attention similarity (default: the first data set of the --after analysis)")
  p.add_argument("--max-examples", type=int, default=500,
                 help="sequences for the attention similarity (default 500)")
  p.add_argument("--max-length", type=int, default=128, help="wordpieces per sequence (default 128)")
  add_redo(p, names.COMPARE)
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  from heads_jax.pipelines.compare import run_compare
  run_compare(args.before, args.after, args.out, title=args.title,
              before_model=args.before_model, after_model=args.after_model, data=args.data,
              max_examples=args.max_examples, max_length=args.max_length, redo=args.redo)
