"""Roles over training: analyse every kept checkpoint of a pre-training or fine-tuning run.

Writes trajectory.csv (per checkpoint: coarse role shares, mean sieve bias per role, sink rate)
and trajectory.png/.svg into --out. Thin entry point over
``heads_jax.pipelines.trajectory.run_trajectory``.
"""

from __future__ import annotations
from heads_jax.cli import add_redo
from heads_jax.pipelines import names


def add_args(p):
  p.add_argument("--run", required=True, metavar="WORKDIR",
                 help="work directory of a pre-training or fine-tuning run (its checkpoints/ and "
                      "exported model/); keep every checkpoint with --config.checkpoint.keep=0")
  p.add_argument("--out", default=None, help="output directory (default: WORKDIR/trajectory)")
  p.add_argument("--data", action="append", default=None, metavar="SPEC",
                 help="data spec, repeatable (default: ud-ewt and mrpc; text data without a parser)")
  p.add_argument("--max-examples", type=int, default=100,
                 help="first N examples of each data set (default 100)")
  p.add_argument("--max-length", type=int, default=128, help="wordpieces per sequence (default 128)")
  p.add_argument("--batch-size", type=int, default=32, help="sequences per device step (default 32)")
  p.add_argument("--roles", default=None, help="comma-separated roles (default: all)")
  add_redo(p, names.TRAJECTORY, default_note="a rerun analyses only checkpoints not analysed "
           "before")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.pipelines.trajectory import run_trajectory
  out = args.out or f"{args.run.rstrip('/')}/trajectory"
  run_trajectory(args.run, out, data=tuple(args.data or ("ud-ewt", "mrpc")),
                 max_examples=args.max_examples, max_length=args.max_length,
                 batch_size=args.batch_size, roles=tuple(r for r in (args.roles or ",".join(ROLES)).split(",") if r),
                 redo=args.redo)
