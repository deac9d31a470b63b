"""Fine-tune BERT on a GLUE task (MRPC, QQP, SST-2, QNLI) with LAMB, resumable.

  heads-jax finetune --config configs/finetune.py:tiny_sst2 --workdir runs/ft_tiny
  heads-jax finetune --config configs/finetune.py:mrpc,bs=32,lr=1e-4 --workdir runs/mrpc \\
      --config.init_checkpoint=path/to/bert-base-uncased

(``python train/finetune.py ...`` takes the same flags.) The best dev checkpoint is exported to
WORKDIR/best_model (heads_jax; ``heads-jax analyze`` reads it) and WORKDIR/best_hf (Hugging
Face). Rerunning the same command resumes. Thin entry point over
``heads_jax.training.finetune.train_and_evaluate``.
"""

from __future__ import annotations

import sys

from heads_jax.training import configlib

DEFAULT_CONFIG = "configs/finetune.py:tiny"


def add_args(p):
  configlib.add_config_args(p, DEFAULT_CONFIG)
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  config = configlib.load_config(args.config, args.overrides)
  if args.print_config:
    print(config)
    return 0
  from heads_jax.training import finetune
  summary = finetune.train_and_evaluate(config, args.workdir)
  best, exports = summary["best"], summary["exports"]
  score = best.get("score")
  line = (f"done: best {summary['select_metric']} {score:.4g} at step {best.get('step')}"
          if isinstance(score, (int, float)) else "done: no evaluation kept")
  if exports:
    line += f"; exported to {exports['heads_jax']} (heads_jax) and {exports['hf']} (Hugging Face)"
  print(line)
  return 0


if __name__ == "__main__":
  from heads_jax import cli
  sys.exit(cli.main(["finetune", *sys.argv[1:]]))
