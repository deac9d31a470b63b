"""GLUE fine-tuning with LAMB; thin entry point over heads_jax.training.finetune.

  python train/finetune.py --config configs/finetune.py:tiny --workdir /tmp/ft_tiny
  python train/finetune.py --config configs/finetune.py:mrpc,bs=32,lr=1e-4 --workdir runs/mrpc \\
      --config.init_checkpoint=/path/to/bert-base-uncased

The best model is exported to WORKDIR/best_model (heads_jax; `heads-jax analyze` reads it) and
WORKDIR/best_hf (Hugging Face). Rerunning the same command resumes.
"""

import sys

from heads_jax.training.finetune import main

if __name__ == "__main__":
  sys.exit(main())
