"""Check this machine for heads_jax: platform, devices, versions and XLA flags; every attention
and analysis path on a tiny model against the float32 reference; BERT-base tokens/s and MFU.

Exits 1 when a path disagrees with the reference (or does not compile here). Run it first on a
new GPU, TPU or Colab runtime. Thin entry point over ``heads_jax.doctor.run_doctor``.
"""

from __future__ import annotations


def add_args(p):
  p.add_argument("--quick", action="store_true",
                 help="time the tiny model at 32 positions instead of BERT-base at 128 (seconds)")
  p.add_argument("--no-timing", action="store_true", help="only the environment and the checks")
  p.add_argument("--steps", type=int, default=3, help="timed steps after compilation (default 3)")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  from heads_jax.doctor import run_doctor
  report = run_doctor(quick=args.quick, timing=not args.no_timing, steps_=max(1, args.steps))
  return 0 if report["ok"] else 1
