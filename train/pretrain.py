"""BERT pre-training (MLM + NSP) with LAMB; thin entry point over heads_jax.training.pretrain.

  python train/pretrain.py --config configs/pretrain.py:tiny --workdir /tmp/pretrain_tiny
  python train/pretrain.py --config configs/pretrain.py:bert_base --workdir gs://.../phase1 \\
      --config.data.tfds_data_dir=gs://.../tfds
  python train/pretrain.py --config configs/pretrain.py:bert_base_phase2 --workdir .../phase2 \\
      --config.init_checkpoint=.../phase1/checkpoints

Overrides: --config.KEY=VALUE, --set KEY=VALUE or trailing KEY=VALUE. Rerunning the same
command resumes from the latest checkpoint in --workdir.
"""

import sys

from heads_jax.training.pretrain import main

if __name__ == "__main__":
  sys.exit(main())
