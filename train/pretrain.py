"""Pre-train BERT (MLM + NSP) with LAMB, data-parallel over all devices, resumable.

  heads-jax pretrain --config configs/pretrain.py:tiny --workdir runs/pt_tiny
  heads-jax pretrain --config configs/pretrain.py:bert_base --workdir gs://BUCKET/pt1
  heads-jax pretrain --config configs/pretrain.py:bert_base_phase2 --workdir gs://BUCKET/pt2 \\
      --config.init_checkpoint=gs://BUCKET/pt1/checkpoints

(``python train/pretrain.py ...`` takes the same flags.) Overrides: ``--config.KEY=VALUE`` or
``--set KEY=VALUE``. Rerunning the same command resumes from the latest checkpoint in
--workdir. Thin entry point over ``heads_jax.training.pretrain.train_and_evaluate``.
"""

from __future__ import annotations

import sys

from heads_jax.training import configlib

DEFAULT_CONFIG = "configs/pretrain.py:tiny"


def add_args(p):
  configlib.add_config_args(p, DEFAULT_CONFIG)
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  config = configlib.load_config(args.config, args.overrides)
  if args.print_config:
    print(config)
    return 0
  from heads_jax.training import pretrain
  summary = pretrain.train_and_evaluate(config, args.workdir)
  print(f"done: step {summary['final_step']} in {summary['workdir']}")
  return 0


if __name__ == "__main__":
  from heads_jax import cli
  sys.exit(cli.main(["pretrain", *sys.argv[1:]]))
