"""``heads-jax demo``'s settings (`heads_jax.pipelines.demo`) as presets.

``get_config(NAME[,steps=N])`` with NAME one of:

* ``finetune``: a real pre-trained encoder fine-tuned on the embedded SST-2 dev set: the
  ``cpu_sst2`` preset of configs/finetune.py (32 x 64 wordpieces per step, LAMB, peak rate
  2e-4, 10% warm-up, linear decay) on a seeded 75/25 split into train and held-out rows; one
  evaluation, at the end (the reported accuracy is not selected on the held-out rows).
  ``init_checkpoint`` is the demo's model (set by the demo). Default 250 steps.
* ``pretrain``: the ``tiny`` pre-training preset of configs/pretrain.py with the 6-layer x
  8-head ``demo`` model on the embedded books, a demonstration of the pipeline. Default 400
  steps.
* ``analysis``: the demo's analyses (`AnalysisConfig.from_config`): the first N UD EWT test
  sentences (gold parses: the syntactic roles) and N MRPC dev pairs (the block role), no
  parser, with the second pass (norm-weighted roles, attention sinks, heads as parsers).

``steps=N`` scales the schedule (warm-up a tenth, evaluation and checkpoints with it).
"""

import ml_collections

from heads_jax.training.configlib import PACKAGED_CONFIGS, load_config

PRESETS = ("finetune", "pretrain", "analysis")


def _parse(arg: str) -> tuple[str, dict]:
  name, *opts = [a.strip() for a in (arg or "finetune").split(",") if a.strip()]
  kv = {}
  for o in opts:
    k, _, v = o.partition("=")
    if k.strip() != "steps" or not v.strip().isdigit() or int(v) < 1:
      raise ValueError(f"configs/demo.py:{arg}: options are steps=N (N >= 1)")
    kv["steps"] = int(v)
  return name, kv


def finetune_config(steps: int = 250) -> ml_collections.ConfigDict:
  from heads_jax.data.assets import glue_dir
  c = load_config(f"{PACKAGED_CONFIGS / 'finetune.py'}:cpu_sst2")  # the shipped file, whatever the cwd holds
  c.preset = "demo_sst2"
  c.data.glue_dir = str(glue_dir())
  c.data.train_split = "dev"
  c.data.holdout_fraction = 0.25
  c.num_train_steps = steps
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.eval_every = steps  # once, at the end: the reported accuracy is not selected on the held-out rows
  c.checkpoint.every_steps = max(1, steps // 2)
  c.eval_batch_size = 64
  c.log_every = 25
  return c


def pretrain_config(steps: int = 400) -> ml_collections.ConfigDict:
  c = load_config(f"{PACKAGED_CONFIGS / 'pretrain.py'}:tiny")
  c.preset = "demo"
  c.model.size = "demo"
  c.num_train_steps = steps
  c.batch_size = 32
  c.data.max_seq_length = 64
  c.data.max_predictions = 10
  c.optimizer.learning_rate = 5e-3
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.checkpoint.every_steps = 100
  c.log_every = 25
  c.eval_every = max(1, steps // 4)
  c.eval_batches = 4
  return c


def analysis_config() -> ml_collections.ConfigDict:
  # robustness: the second pass (norm-weighted roles, attention sinks, heads as parsers), so
  # the demo's reports show what README's "Are the roles real?" describes
  return ml_collections.ConfigDict({"data": ("ud-ewt", "mrpc"), "parser": "none",
                                    "batch_size": 32, "robustness": True})


def get_config(arg: str = "finetune") -> ml_collections.ConfigDict:
  name, kv = _parse(arg)
  if name == "finetune":
    return finetune_config(**kv)
  if name == "pretrain":
    return pretrain_config(**kv)
  if name == "analysis" and not kv:
    return analysis_config()
  raise ValueError(f"unknown demo preset {arg!r}: one of {', '.join(PRESETS)}[,steps=N]")
