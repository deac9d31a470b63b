"""GLUE fine-tuning with LAMB (Pande et al. 2021: MRPC, QQP, SST-2, QNLI).

``--config configs/finetune.py:TASK[,bs=B][,lr=LR][,steps=N]`` with TASK one of ``mrpc``,
``qqp``, ``sst2``, ``qnli`` (the paper's setting), ``cpu_TASK`` (a small pretrained model such as
all-MiniLM-L6-v2 on a CPU) or ``tiny`` / ``tiny_TASK`` (a tiny random model, for smoke tests).

The paper's grid: batch size {32, 128} x learning rate {1e-4, 2e-4}, LAMB with 10K warm-up
steps. It does not give the number of steps; we train 20K steps (twice the warm-up, so the
learning rate peaks half-way and decays linearly to 0), evaluate every 1,000 steps and keep the
best checkpoint by dev F1 (MRPC, QQP) or accuracy (SST-2, QNLI). Defaults: batch 32, lr 1e-4;
``bs=128,lr=2e-4`` etc. pick another grid point (see ``GRID``). Sequence length 128,
weight decay 0.01, dropout 0.1, bfloat16 compute.

Data: ``data.source = "tsv"`` reads GLUE TSV folders under ``data.glue_dir`` (default
``$HEADS_JAX_GLUE_DIR`` or ``../shared/data/glue`` beside the checkout); ``"tfds"`` reads prepared TFDS
``glue/<task>``. A task without a train split there (QNLI here: dev and test only; QQP: only
``train_subset``) is an error unless ``data.fallback_train_split`` names the split to train on
instead: then the run trains on 90% of it and evaluates on the other 10%
(``data.holdout_fraction``, ``data.holdout_seed``) and writes which rows to
``workdir/data.json``. The ``cpu_qnli`` and ``cpu_qqp`` presets set it (``dev``,
``train_subset``); the paper's presets do not (use TFDS there).

``init_checkpoint``: a Hugging Face BERT folder (e.g. ``bert-base-uncased``), a heads_jax model
folder (e.g. a pre-training run's ``workdir/model``) or a pre-training run's ``checkpoints``
folder (its encoder parameters; the classifier starts fresh). The paper's presets (``TASK``,
``squad``) and the ``cpu_`` ones refuse to start without it; ``--config.from_scratch=true``
fine-tunes a randomly initialised model on purpose (the ``tiny`` presets always do).

SQuAD: ``squad``, ``cpu_squad``, ``tiny_squad`` (``squad_config``; a ``squad`` block of data and
window settings).

More GLUE (``MORE_TASKS``: Kovaleva et al. and Michel et al. also fine-tune on these): ``mnli``,
``rte``, ``cola`` (Matthews' correlation), ``stsb`` (a regression: one output, mean squared
error, Pearson's and Spearman's correlations; the best model by Spearman's, which the BERT paper
reports for STS-B) and ``wnli``, with the same ``TASK``, ``cpu_TASK`` and ``tiny_TASK`` forms.
MNLI evaluates on ``dev_matched``; ``--config.data.eval_split=dev_mismatched`` for the other.
"""

import ml_collections

from heads_jax import env
from heads_jax.training.configlib import distributed_config, optimizer_config

GLUE_DIR = env.get("HEADS_JAX_GLUE_DIR")
TASKS = ("mrpc", "qqp", "sst2", "qnli")
MORE_TASKS = ("mnli", "rte", "cola", "stsb", "wnli")
ALL_TASKS = TASKS + MORE_TASKS
# cpu_TASK: (train steps, max sequence length, batch size, peak learning rate). SST-2 and MRPC are
# measured (README); QNLI and QQP follow them by data-set size, not measured. LAMB moves each
# layer by about lr x its norm per step, so a small data set (MRPC: 3,668 pairs) gets smaller
# batches and a higher rate: more, larger steps per epoch (about 3 epochs of MRPC, 1 of SST-2).
CPU_SCHEDULE = {"sst2": (2000, 64, 32, 2e-4), "mrpc": (700, 128, 16, 4e-4),
                "qnli": (900, 128, 16, 4e-4), "qqp": (2000, 128, 32, 2e-4),
                # not measured: by data-set size as above (RTE 2,490 pairs, WNLI 635, CoLA 8,551
                # short sentences, STS-B 5,749 pairs, MNLI 393K pairs)
                "rte": (700, 128, 16, 4e-4), "wnli": (200, 128, 16, 4e-4),
                "cola": (800, 64, 32, 2e-4), "stsb": (900, 128, 16, 4e-4),
                "mnli": (2000, 128, 32, 2e-4)}
GRID = {"batch_size": (32, 128), "learning_rate": (1e-4, 2e-4)}
SQUAD_FILE = env.get("HEADS_JAX_SQUAD_FILE")
SQUAD_PRESETS = ("squad", "cpu_squad", "tiny_squad")



def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = ""
  c.task = "mrpc"
  c.seed = 0
  c.data_seed = 0
  c.dropout_seed = 1
  c.tokenizer = ""         # "" = the init checkpoint's tokenizer, else the embedded vocabulary
  c.init_checkpoint = ""   # HF dir, heads_jax dir or a pre-training run's checkpoints dir
  # The paper's presets refuse to start without init_checkpoint (a randomly initialised BERT-base
  # fine-tuned for 20K steps is rarely what was meant); True fine-tunes from random weights.
  c.from_scratch = False

  c.model = ml_collections.ConfigDict()  # used when init_checkpoint is empty or an Orbax run
  c.model.size = "base"
  c.model.dtype = "bfloat16"
  c.model.hidden_dropout = 0.1
  # 0.1 fine-tunes on the explicit attention path; 0.0 on the fused one (heads_jax/model/bert.py)
  c.model.attention_dropout = 0.1
  c.model.max_position_embeddings = 512

  c.data = ml_collections.ConfigDict()
  c.data.source = "tsv"    # tsv | tfds
  c.data.glue_dir = GLUE_DIR
  c.data.tfds_data_dir = ""
  c.data.train_split = "train"
  c.data.eval_split = "dev"
  c.data.holdout_fraction = 0.0  # > 0: evaluate on a seeded holdout of the train split
  c.data.holdout_seed = 0
  c.data.fallback_train_split = ""  # a split to cut train + eval from when train_split is missing
  c.data.max_examples = 0  # > 0: read at most this many rows per split
  c.data.max_seq_length = 128

  c.batch_size = 32
  c.eval_batch_size = 128
  c.num_train_steps = 20_000

  c.optimizer = optimizer_config(learning_rate=1e-4, warmup_steps=10_000)

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1_000
  c.checkpoint.keep = 2
  c.checkpoint.async_save = True

  c.select_metric = ""     # "" = the task's last metric (heads_jax.data.glue.TASKS): f1 for
  #                          MRPC/QQP, matthews for CoLA, spearman for STS-B, else accuracy
  c.log_every = 100
  c.eval_every = 1_000
  c.stop_at_step = 0
  c.export = True
  c.distributed = distributed_config()
  c.tensorboard = True
  return c


def squad_config(c, name: str) -> None:
  """SQuAD presets (``heads_jax.training.squad``): the ``c.squad`` block and the run's settings.

  * ``squad``: SQuAD v1.1 from TFDS (``squad/v1.1`` train / validation) with the windows of BERT's
    run_squad.py (384 positions, document stride 128, questions cut to 64 pieces; n-best 20,
    answers of at most 30 pieces), batch 32 and 5,500 steps (about two epochs of the 88K
    training windows, as Devlin et al.'s 2 epochs), LAMB at this project's GLUE rate 1e-4 with
    10% warm-up (not tuned for SQuAD). Needs ``init_checkpoint`` (e.g. bert-base-uncased).
  * ``cpu_squad``: a small pretrained encoder (all-MiniLM-L6-v2) on a shared 2-core CPU, on the
    shared SQuAD 2.0 dev subset read as v1.1 (its 705 answerable questions): trained on the
    questions of four articles (581 questions, 1,012 windows), evaluated on the fifth
    (``Victoria_(Australia)``, 124 questions, 224 windows). Short windows (128 positions, stride
    64) and 100 steps of 16 windows (about 1.6 epochs), LAMB at 1e-3 with 10 warm-up steps (a
    short run on little data: a high rate; 4e-4 over 48 steps of 192 positions reached only F1
    7.0), so that it needs about 6 minutes of CPU time. Measured in README (EM 9.7 / F1 23.2).
    A tiny run, not the paper's setting.
  * ``tiny_squad``: a tiny random model on a few articles of the shared file (tests).
  """
  c.task = "squad"
  c.select_metric = "f1"
  c.squad = ml_collections.ConfigDict()
  c.squad.source = "json"       # json | tfds
  c.squad.version = "v1"        # v1: answerable questions (SQuAD 1.1); v2: all (null answers)
  c.squad.train_file = ""
  c.squad.eval_file = ""
  c.squad.eval_titles = ""      # "A|B": hold these articles of train_file out as the eval set
  c.squad.doc_stride = 128
  c.squad.max_query_length = 64
  c.squad.n_best_size = 20
  c.squad.max_answer_length = 30
  c.squad.null_score_diff_threshold = 0.0
  c.data.max_seq_length = 384
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.eval_batch_size = 64
  if name == "squad":
    c.squad.source = "tfds"
    c.num_train_steps = 5_500
    c.optimizer.warmup_steps = 550
    c.eval_every = 500
    c.checkpoint.every_steps = 500
  else:  # cpu_squad, tiny_squad: the shared SQuAD file, float32 (LOCAL_SQUAD)
    c.squad.train_file = SQUAD_FILE
    c.model.dtype = "float32"
    for key, value in LOCAL_SQUAD[name].items():
      section, _, field = key.rpartition(".")
      (c[section] if section else c)[field] = value


# The SQuAD presets on the shared file, field by field: cpu_squad a small pretrained encoder on
# a shared 2-core CPU, tiny_squad a tiny random model on a few articles (tests).
LOCAL_SQUAD = {
    "cpu_squad": {"squad.eval_titles": "Victoria_(Australia)", "data.max_seq_length": 128,
                  "squad.doc_stride": 64, "batch_size": 16, "eval_batch_size": 32,
                  "num_train_steps": 100, "optimizer.learning_rate": 1e-3,
                  "optimizer.warmup_steps": 10, "eval_every": 50, "checkpoint.every_steps": 50,
                  "log_every": 4},
    "tiny_squad": {"squad.eval_titles": "Normans", "data.max_examples": 64, "model.size": "tiny",
                   "data.max_seq_length": 64, "squad.doc_stride": 32,
                   "squad.max_query_length": 24, "batch_size": 8, "eval_batch_size": 16,
                   "num_train_steps": 6, "optimizer.learning_rate": 1e-2,
                   "optimizer.warmup_steps": 2, "checkpoint.every_steps": 3, "log_every": 2,
                   "eval_every": 3},
}


def _parse(arg: str):
  name, *opts = [a.strip() for a in (arg or "mrpc").split(",") if a.strip()]
  kv = {}
  for o in opts:
    k, _, v = o.partition("=")
    kv[k.strip()] = v.strip()
  return name, kv


def get_config(arg: str = "mrpc") -> ml_collections.ConfigDict:
  name, kv = _parse(arg)
  c = base_config()
  c.preset = arg
  if name in SQUAD_PRESETS:
    squad_config(c, name)
  elif name in ALL_TASKS:
    c.task = name
  elif name == "tiny" or name.startswith("tiny_"):
    task = name[len("tiny_"):] if name.startswith("tiny_") else "sst2"
    if task not in ALL_TASKS:
      raise ValueError(f"unknown task in preset {name!r}; one of {ALL_TASKS}")
    from heads_jax.data.assets import glue_dir
    c.task = task
    c.model.size = "tiny"
    c.model.dtype = "float32"
    c.data.glue_dir = str(glue_dir()) if task in ("sst2", "mrpc") else GLUE_DIR
    c.data.train_split = "dev"      # the embedded copies hold dev only: seeded holdout
    c.data.holdout_fraction = 0.2
    c.data.max_seq_length = 64
    c.batch_size = 32
    c.eval_batch_size = 64
    c.num_train_steps = 100
    c.optimizer.learning_rate = 1e-2  # LAMB moves each layer by ~lr x its norm per step
    c.optimizer.warmup_steps = 10
    c.checkpoint.every_steps = 50
    c.log_every = 10
    c.eval_every = 50
  elif name.startswith("cpu_"):
    task = name[len("cpu_"):]
    if task not in ALL_TASKS:
      raise ValueError(f"unknown task in preset {name!r}; one of {ALL_TASKS}")
    # A pretrained small encoder (e.g. all-MiniLM-L6-v2, 22M parameters) fine-tuned on a CPU:
    # float32 (bfloat16 is emulated, hence slow, on most CPUs), CPU_SCHEDULE's steps, batch and
    # rate, 10% warm-up, frequent dev evaluation. Needs ``init_checkpoint`` (or ``init=DIR``).
    c.task = task
    c.model.dtype = "float32"
    steps, seq, batch, lr = CPU_SCHEDULE[task]
    c.num_train_steps = steps
    c.batch_size = batch
    c.optimizer.learning_rate = lr
    c.optimizer.warmup_steps = steps // 10
    c.data.max_seq_length = seq
    # The shared GLUE copy has no QNLI train and only a QQP train subset: say which split to cut.
    c.data.fallback_train_split = {"qnli": "dev", "qqp": "train_subset"}.get(task, "")
    c.eval_every = 100 if steps < 1000 else 250
    c.checkpoint.every_steps = c.eval_every
    c.log_every = 25
  else:
    raise ValueError(
        f"unknown fine-tuning preset {name!r}: one of {ALL_TASKS}, cpu_TASK, tiny, tiny_TASK, "
        f"{', '.join(SQUAD_PRESETS)}")
  for k, v in kv.items():
    if k in ("bs", "batch_size"):
      c.batch_size = int(v)
    elif k in ("lr", "learning_rate"):
      c.optimizer.learning_rate = float(v)
    elif k in ("steps", "num_train_steps"):
      c.num_train_steps = int(v)
    elif k in ("warmup", "warmup_steps"):
      c.optimizer.warmup_steps = int(v)
    elif k == "init":
      c.init_checkpoint = v
    else:
      raise ValueError(f"unknown option {k!r} in {arg!r}: bs, lr, steps, warmup, init")
  return c
