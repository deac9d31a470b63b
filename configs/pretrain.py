"""BERT pre-training (masked LM + next-sentence prediction) with LAMB.

Presets (``--config configs/pretrain.py:PRESET``):

* ``bert_base`` / ``bert_base_phase1``: the paper's setting (Pande et al. 2021 pre-train BERT-base on
  Wikipedia + Project Gutenberg on a Cloud TPU v3-8): sequence length 128, 20 predictions per
  sequence, 300K steps. The paper's only word on the pre-training batch is "a batch size of 2K
  tokens" ("another 1K steps with a sequence length of 512 and a batch size of 2K tokens",
  pande2021_heads_hypothesis.txt, "Experimental Setup"): 4 sequences of 512, or 16 of 128, which
  would leave a v3-8's eight cores with 2 sequences each; it gives no learning rate. We use BERT's
  batch of 256 sequences (32 per TPU v3 core, which fits comfortably; ``--config.batch_size=16``
  is the 2K-token reading at length 128) and LAMB with peak learning rate 6.25e-4 (You et al.
  2019's value for batch 512, kept for 256 as a safe choice), 10K linear warm-up steps (BERT's)
  then linear decay to 0, weight decay 0.01,
  bfloat16 compute (float32 master weights).
* ``bert_base_b512``: phase 1 at batch 512 (issue 39: larger GEMM tiles and half the per-step
  fixed costs per token; LAMB is made for large batches): 150K steps (the same 9.8 G tokens as
  300K x 256), 5K warm-up steps (the same share), peak learning rate 6.25e-4 (You et al. 2019's
  value for batch 512). Fits one 80 GB GPU at sequence 128 without accumulation.
* ``bert_base_phase2``: sequence length 512, 80 predictions, 1K steps, batch 256, peak 4e-4
  with 100 warm-up steps. It starts from the *parameters* of phase 1 (``init_checkpoint`` =
  the phase-1 run's ``checkpoints`` folder); optimizer state and schedule start afresh, as in
  the BERT/NVIDIA two-phase recipe.
* ``tiny`` (and ``tiny_phase2``): the same pipeline on this machine's CPU: the ``tiny`` model
  (2 layers, 4 heads, hidden 64), the three Gutenberg books embedded in the package,
  sequence length 128 (64 for ``tiny`` phase 1 to be quick), float32.
* ``small``: a 6-layer, 8-head, hidden-256 model for one GPU or a Colab TPU (quick experiments).

Data sources (``data.sources``): ``;``-separated; each a prepared corpus directory (what
``heads-jax prepare-corpus`` writes from English Wikipedia + the Gutenberg books: the paper's
corpus; ``HEADS_JAX_CORPUS``, default ``corpus/paper``, for the ``bert_base`` presets), ``tfds:NAME``
(a prepared TFDS text data set) or comma-separated text paths (files, directories of ``*.txt``,
globs). Any of them may be a ``gs://`` URL. ``HEADS_JAX_GUTENBERG`` points to a Gutenberg folder
(default: ``../shared/data/corpus/gutenberg`` beside the checkout).

Held-out evaluation text is never trained on: unless ``data.eval_sources`` names other text, the
evaluation stream reads the held-out side of ``data.sources`` and the training stream the rest
(a prepared corpus has the split built in; text and TFDS sources are split by document with
``data.heldout_fraction``, see ``heads_jax.data.corpora``).

Memory per core of the paper's run on a TPU v3-8 (16 GiB of HBM per core; data parallel, so
every core holds the whole model and 256 / 8 = 32 sequences), from
``heads_jax.training.memory.estimate_config(config, 8)`` (bfloat16 activations, attention
dropout 0.1; Korthikanti et al. 2022's ``34 s b h + 5 a s^2 b`` bytes per layer)::

                                          phase 1 (128)   phase 2 (512)
    parameters (float32, 110.1M)               0.41 GiB        0.41 GiB
    gradients (float32)                        0.41 GiB        0.41 GiB
    LAMB state (2 float32 moments)             0.82 GiB        0.82 GiB
    activations kept for the backward pass     1.55 GiB       10.41 GiB
    MLM logits and their gradient              0.15 GiB        0.58 GiB
    total                                      3.33 GiB       12.63 GiB  of 16 GiB

Phase 2 fits with about 3.4 GiB left for XLA's temporaries (the estimate is a lower bound; only
a real v3-8 shows the peak). If it does not (an out-of-memory error names the batch size), halve
the activations with gradient accumulation, the same update of 256 sequences in two steps of
128: ``--config.batch_size=128 --config.optimizer.accumulate_steps=2
--config.num_train_steps=2000`` (steps count micro-batches); or drop attention dropout
(``--config.model.attention_dropout=0``: the fused attention keeps no ``[s, s]`` tensor, 4.8 GiB
of activations, 7.0 GiB in all). Per-layer rematerialisation is not needed at these sizes and is
not implemented.
"""

import ml_collections

from heads_jax import env
from heads_jax.training.configlib import distributed_config, optimizer_config

GUTENBERG = env.get("HEADS_JAX_GUTENBERG")
CORPUS = env.get("HEADS_JAX_CORPUS")  # heads-jax prepare-corpus --out ...


def _embedded_books() -> str:
  from heads_jax.data.assets import gutenberg_paths
  return ",".join(str(p) for p in gutenberg_paths())



def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = ""
  c.seed = 0              # parameter initialisation
  c.data_seed = 0         # example stream: batch N is a function of (data_seed, N)
  c.dropout_seed = 1      # dropout key of step N: fold_in(key(dropout_seed), N)
  # the key's implementation (heads_jax.training.steps.DROPOUT_RNGS): "rbg" draws the dropout
  # bits with XLA's RngBitGenerator, still a function of (seed, step); "threefry2x32" is JAX's
  # default (and what runs started before 2026-11-27 used)
  c.dropout_rng = "rbg"
  # MLM logits: "padded" = compute dtype over the vocabulary padded to a multiple of 64 (the
  # padding masked), float32 log-sum-exp; "float32" = float32 logits (before 2026-11-27)
  c.mlm_logits = "padded"
  # XLA options of the train step's compilation, "name=value,..." (training.steps.
  # parse_compiler_options), e.g. "xla_gpu_enable_cublaslt=true,xla_gpu_enable_cudnn_layer_norm=
  # true" (bench/pretrain_ab.py measures them: V9, V12, V14); "" = XLA's defaults
  c.xla_options = ""

  c.model = ml_collections.ConfigDict()
  c.model.size = "base"   # tiny | mini | small | base | large (heads_jax.model.config.SIZES)
  c.model.dtype = "bfloat16"
  c.model.hidden_dropout = 0.1
  # BERT's 0.1: trains on the explicit attention path (dropout needs the probabilities); 0.0
  # lets the model use the fused attention (cuDNN on a GPU; heads_jax/model/bert.py).
  c.model.attention_dropout = 0.1
  c.model.max_position_embeddings = 512
  # random bits per dropout-mask element (heads_jax.model.fused_ops.dropout_keep): 8 cuts a
  # 32-bit word into four masks' bits (a quarter of the words drawn: 1.23 G a BERT-base step at
  # 32), keeping with probability round(0.9 * 256) / 256 = 0.8984 (kept values scaled by its
  # inverse); 32 is nnx.Dropout's own draw (what runs started before 2026-11-29 used)
  c.model.dropout_bits = 8

  c.tokenizer = ""        # HF folder or vocab.txt; "" = the embedded bert-base-uncased vocabulary

  c.data = ml_collections.ConfigDict()
  c.data.sources = CORPUS    # the prepared Wikipedia + Gutenberg corpus (heads-jax prepare-corpus)
  c.data.weights = ""     # comma-separated mixture weights; "" = proportional to size
  c.data.layout = "paragraphs"  # text files: paragraphs (one book per file) | lines (BERT format)
  c.data.split = "train"  # TFDS split
  c.data.tfds_data_dir = ""
  c.data.text_key = "text"
  c.data.max_seq_length = 128
  c.data.max_predictions = 20
  c.data.masked_lm_prob = 0.15
  c.data.short_seq_prob = 0.1
  c.data.random_next_prob = 0.5
  c.data.whole_word_mask = False
  # processes building batches (0: one background thread; -1: all but 2 of the host's cores,
  # at most 32: heads_jax.data.prefetch.auto_workers). One process makes ~400-900 examples/s at
  # length 128 (a 256 x 128 batch: 0.28 CPU-s) and ~150-300 at 512, so BERT-base at 35-45 ms a
  # step needs 7-8; a 16-core GPU host gets 14, a TPU v3-8 VM (96 vCPUs) 32. The run's log says
  # when the input starves the device (heads_jax.training.loop).
  c.data.num_workers = -1
  c.data.prefetch = 8
  c.data.eval_sources = ""  # other held-out text; "" = the held-out side of data.sources
  c.data.heldout_fraction = 0.005  # text / TFDS sources: share of documents held out (never trained on)
  c.data.eval_seed = 1_000_003
  c.data.unigram_examples = 2048  # held-out examples for the unigram baseline (0: skip)

  c.batch_size = 256      # global batch size (all devices and hosts)
  c.num_train_steps = 300_000

  c.optimizer = optimizer_config(learning_rate=6.25e-4, warmup_steps=10_000)
  # LAMB as the optax chain (optimizer.lamb). True: over one flat vector
  # (heads_jax.training.optimizer.flat_lamb; the same update in a few passes instead of ~2,200
  # CPU kernels), measured slower on an H200 (2026-11-27: 94.1 ms a step against 58.4, one
  # scatter since replaced); without it its passes took ~2.5 ms against the chain's 2.6, and its
  # state layout is fixed for a run, so it is not the default (BENCHMARKS.md, issue 49)
  c.optimizer.flat = False

  c.init_checkpoint = ""  # run checkpoints dir (params only), heads_jax dir or HF dir

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 5_000
  c.checkpoint.keep = 3   # the newest kept; 0 keeps every checkpoint (`heads-jax trajectory`)
  c.checkpoint.async_save = True

  c.log_every = 100
  c.eval_every = 10_000
  c.eval_batches = 20
  c.stop_at_step = 0      # > 0: stop (with a checkpoint) after this step; resume later
  c.export = True         # at the end: workdir/model (heads_jax) and workdir/hf (Hugging Face)
  c.distributed = distributed_config()
  c.tensorboard = True
  return c


def get_config(arg: str = "bert_base") -> ml_collections.ConfigDict:
  c = base_config()
  c.preset = arg
  if arg in ("bert_base", "bert_base_phase1"):
    pass
  elif arg == "bert_base_b512":
    c.batch_size = 512
    c.num_train_steps = 150_000
    c.optimizer.warmup_steps = 5_000
    c.checkpoint.every_steps = 2_500
    c.eval_every = 5_000
  elif arg == "bert_base_phase2":
    c.data.max_seq_length = 512
    c.data.max_predictions = 80
    c.num_train_steps = 1_000
    c.optimizer.learning_rate = 4e-4
    c.optimizer.warmup_steps = 100
    c.checkpoint.every_steps = 250
    c.eval_every = 500
    c.init_checkpoint = "PHASE1_WORKDIR/checkpoints"  # set with --config.init_checkpoint=...
  elif arg in ("small", "small_phase2"):
    c.model.size = "small"
    c.batch_size = 128
    c.num_train_steps = 50_000
    c.data.num_workers = 4
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 2_000
    c.data.sources = GUTENBERG
    c.eval_every = 5_000
    if arg == "small_phase2":
      c.data.max_seq_length, c.data.max_predictions = 512, 80
      c.num_train_steps, c.optimizer.warmup_steps = 1_000, 100
      c.init_checkpoint = "PHASE1_WORKDIR/checkpoints"
  elif arg in ("tiny", "tiny_phase2"):
    c.model.size = "tiny"
    c.model.dtype = "float32"
    # The CPU preset keeps the step the README's and the demo's figures were measured with
    # (issue 39's changes are for accelerators; each is an override away, e.g.
    # --config.dropout_rng=rbg --config.model.dropout_bits=8 --config.optimizer.flat=true
    # --config.mlm_logits=padded)
    c.dropout_rng = "threefry2x32"
    c.model.dropout_bits = 32
    c.optimizer.flat = False
    c.mlm_logits = "float32"
    c.data.sources = _embedded_books()
    c.data.heldout_fraction = 0.3  # of the books' 64 KiB parts: 2 of 9 (85 KB) held out
    c.data.max_seq_length = 64
    c.data.max_predictions = 10
    c.data.num_workers = 0
    c.data.prefetch = 2
    # 128 x 64 wordpieces per step. The loss first falls to the unigram baseline (the held-out
    # text's wordpiece entropy, ~6.23 nats, printed at the start), then below it as the model
    # learns to use the context; measured figures are in the README.
    c.batch_size = 128
    c.num_train_steps = 1000
    c.optimizer.learning_rate = 1e-2
    c.optimizer.warmup_steps = 50
    c.checkpoint.every_steps = 50
    c.checkpoint.keep = 0   # all of them: `heads-jax trajectory` draws the roles over training
    c.checkpoint.async_save = True
    c.log_every = 25
    c.eval_every = 250
    c.eval_batches = 4
    if arg == "tiny_phase2":
      c.data.max_seq_length = 128
      c.data.max_predictions = 20
      c.num_train_steps = 20
      c.optimizer.warmup_steps = 2
      c.checkpoint.every_steps = 10
      c.eval_every = 20
      c.init_checkpoint = "PHASE1_WORKDIR/checkpoints"
  else:
    raise ValueError(f"unknown pre-training preset {arg!r}: bert_base, bert_base_phase1, "
                     f"bert_base_b512, bert_base_phase2, small, small_phase2, tiny, tiny_phase2")
  return c
