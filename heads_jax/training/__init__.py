"""Pre-training (MLM + NSP) and GLUE fine-tuning with LAMB, data-parallel and resumable.

Modules: ``optimizer`` (LAMB with BERT conventions, schedule), ``steps`` (jitted train/eval
steps over the ``data`` mesh), ``checkpointing`` (Orbax), ``metrics`` (JSON lines,
TensorBoard, throughput, MFU), ``loop`` (restore-or-init, the training loop), ``configlib``
(config files and overrides), ``pretrain`` and ``finetune`` (``run(config, workdir)`` and
the command-line entry points). Configs: ``configs/pretrain.py``, ``configs/finetune.py``.
"""
