"""Pre-training (MLM + NSP) and GLUE fine-tuning with LAMB, data-parallel and resumable.

Modules: ``optimizer`` (LAMB with BERT conventions, schedule), ``steps`` (jitted train/eval
steps over the ``data`` mesh), ``checkpointing`` (Orbax), ``metrics`` (JSON lines,
TensorBoard, throughput, MFU), ``loop`` (restore-or-init, the training loop), ``rundir`` (every
path of a run's work directory), ``job`` (the set-up both jobs share: mesh, optimizer, model,
checkpoints, metrics, export), ``configlib`` (config files and overrides), ``pretrain`` and
``finetune`` (``train_and_evaluate(config, workdir)``; their entry points are
``train/pretrain.py`` and ``train/finetune.py``). Configs: ``heads_jax.configs``.
"""
