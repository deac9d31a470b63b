"""Config files (ml_collections, big_vision / flax-examples style) and their overrides.

A config file is a Python file with ``get_config(arg=None) -> ml_collections.ConfigDict``;
``load_config("configs/pretrain.py:tiny")`` imports it and calls ``get_config("tiny")``.
Overrides are ``key.sub=value`` strings (``--config.key.sub=value`` on a command line, see
``split_config_overrides``); the value is parsed as a Python literal when it is one
(``1e-4``, ``True``, ``[1, 2]``), ``true``/``false`` as booleans, else kept as a string, and
must fit the type of the field it replaces.
"""

from __future__ import annotations

import ast
import datetime as _dt
import importlib.util
import json
import math
from pathlib import Path

import ml_collections

import heads_jax.configs
from heads_jax import storage
from heads_jax.storage import write_text
from heads_jax.errors import UserError

PACKAGED_CONFIGS = Path(heads_jax.configs.__file__).parent  # the repository's configs/, installed


def config_path(path: str) -> Path:
  """The config file ``path`` names: the file itself when it exists, else the file of that name
  shipped in ``heads_jax.configs`` (so ``configs/pretrain.py`` works from any directory)."""
  p = Path(path)
  if not p.is_file() and (PACKAGED_CONFIGS / p.name).is_file():
    p = PACKAGED_CONFIGS / p.name
  if not p.is_file():
    shipped = ", ".join(sorted(f.name for f in PACKAGED_CONFIGS.glob("*.py") if f.name != "__init__.py"))
    raise UserError(f"config file {path} does not exist; pass a Python file defining get_config, "
                    f"or one of the shipped configs/{{{shipped}}} with :PRESET")
  return p


def load_config(spec: str, overrides=()) -> ml_collections.ConfigDict:
  """``spec`` = ``path/to/file.py[:arg]``; returns the config with ``overrides`` applied."""
  path, _, arg = str(spec).partition(":")
  p = config_path(path)
  module_spec = importlib.util.spec_from_file_location(f"_heads_jax_config_{p.stem}", p)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise UserError(f"{p} defines no get_config(arg) function")
  config = module.get_config(arg) if arg else module.get_config()
  return apply_overrides(config, overrides)


def parse_value(text: str):
  low = text.strip().lower()
  if low in ("true", "false"):
    return low == "true"
  if low in ("none", "null"):
    return None
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config: ml_collections.ConfigDict, overrides) -> ml_collections.ConfigDict:
  """Applies ``key.sub=value`` strings (a leading ``config.`` or ``--config.`` is dropped)."""
  for item in overrides or ():
    if "=" not in item:
      raise UserError(f"config override {item!r} must look like --config.key.sub=value")
    key, _, text = item.partition("=")
    key = key.lstrip("-")
    if key.startswith("config."):
      key = key[len("config."):]
    if key == ALLOW_CHANGES and ALLOW_CHANGES not in config:
      config[ALLOW_CHANGES] = False  # a field of every training run (see check_resume)
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise UserError(f"config has no field {key!r} (no {part!r}); see --print-config")
      node = node[part]
    last = parts[-1]
    if last not in node:
      raise UserError(f"config has no field {key!r}; fields here: {', '.join(sorted(node.keys()))}")
    value = parse_value(text)
    old = node[last]
    if isinstance(old, str) and not isinstance(value, str):
      value = text  # e.g. a path made of digits stays a string
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    if old is not None and not isinstance(old, ml_collections.ConfigDict) and type(value) is not type(old) \
        and not (isinstance(old, (list, tuple)) and isinstance(value, (list, tuple))):
      raise UserError(f"config override {item!r}: {key} must be of type {type(old).__name__} "
                      f"(now {old!r}), got {text!r}")
    try:
      node[last] = value
    except TypeError as e:
      raise UserError(f"config override {item!r}: {e}") from None
  return config


def split_config_overrides(argv):
  """Separates ``--config.key=value`` (or ``--config.key value``) items from ``argv``:
  returns ``(rest, overrides)``. Lets any argparse front end accept the ml_collections
  override syntax."""
  rest, overrides = [], []
  argv = list(argv)
  i = 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      if "=" in a:
        overrides.append(a[2:])
      elif i + 1 < len(argv):
        overrides.append(f"{a[2:]}={argv[i + 1]}")
        i += 1
      else:
        raise UserError(f"{a} needs a value, e.g. {a}=VALUE")
    else:
      rest.append(a)
    i += 1
  return rest, overrides


def add_config_args(parser, default_config: str) -> None:
  """Flags of a training entry point: ``--config FILE[:ARG]``, ``--workdir DIR``, ``--set
  key=value`` (repeatable; ``--config.key=value`` is rewritten to it by ``heads_jax.cli``) and
  ``--print-config``."""
  parser.add_argument("--config", default=default_config,
                      help=f"config file and preset, e.g. {default_config} (default)")
  parser.add_argument("--workdir", required=True,
                      help="run directory (a local path or gs://...): checkpoints, metrics.jsonl, "
                           "TensorBoard files, exports; an existing run there is resumed")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field (repeatable), e.g. --set batch_size=64; "
                           "--config.batch_size=64 works too")
  parser.add_argument("--print-config", action="store_true", help="print the config and exit")


def save_config(config: ml_collections.ConfigDict, path) -> None:
  """Writes ``config`` as JSON to ``path`` (a local path or a URL)."""
  write_text(path, json.dumps(config.to_dict(), indent=2, default=str))


def optimizer_config(learning_rate: float, warmup_steps: int) -> ml_collections.ConfigDict:
  """``config.optimizer`` of the training configs: LAMB with BERT's settings
  (``heads_jax.training.optimizer``: weight decay 0.01, betas 0.9/0.999, eps 1e-6, clipping at
  1.0, linear warm-up then linear decay to 0), one micro-batch per update."""
  o = ml_collections.ConfigDict()
  o.name = "lamb"
  o.learning_rate = learning_rate
  o.warmup_steps = warmup_steps
  o.end_learning_rate = 0.0
  o.power = 1.0
  o.weight_decay = 0.01
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-6
  o.clip_norm = 1.0
  o.accumulate_steps = 1  # micro-batches per update (optax.MultiSteps)
  return o


def distributed_config() -> ml_collections.ConfigDict:
  """Several host processes (a TPU pod slice, several GPU hosts, several processes of one
  machine): ``jax.distributed`` joins them when any field is set. Unset fields are discovered
  on Cloud TPU pods and SLURM / Open MPI / Kubernetes clusters, so there ``enabled=True`` is
  enough; elsewhere give all three, e.g. for process 1 of 2:
  ``--config.distributed.coordinator_address=10.0.0.2:8476 --config.distributed.num_processes=2
  --config.distributed.process_id=1``. Each process feeds its own rows of every global batch;
  all of them write one checkpoint directory (which must then be shared: a ``gs://`` URL or a
  network file system)."""
  d = ml_collections.ConfigDict()
  d.enabled = False            # True: jax.distributed.initialize() with auto-detection
  d.coordinator_address = ""   # host:port of process 0 ("" = auto-detect)
  d.num_processes = 0          # 0 = auto-detect
  d.process_id = -1            # -1 = auto-detect
  d.cpu_collectives = "gloo"   # CPU cross-process collectives (jax_cpu_collectives_implementation)
  return d


# --- A training run's settings: checked before any device work, and kept across resumes. -------

ALLOW_CHANGES = "allow_changes"  # --config.allow_changes=true: resume under changed settings
# Fields that do not change what a run computes (how it runs, where it stops, what it logs).
OPERATIONAL = ("allow_changes", "from_scratch", "stop_at_step", "distributed", "xla_options",
               "data.num_workers", "data.prefetch",
               "log_every", "tensorboard", "export", "checkpoint.async_save", "checkpoint.keep")
# Where the data is read from: not a setting (``TrainingJob.check_data`` compares the data's
# content on a resume, so the same files under another path resume, other content behind the same
# path is refused).
DATA_PATHS = ("data.sources", "data.glue_dir", "squad.train_file", "squad.eval_file")
# Fields a run can never change: its checkpoints hold this model, trained on this task.
FIXED = ("task", "model.size", "model.max_position_embeddings", "tokenizer")
# Settings that change the layout of the optimizer state in the checkpoints (LAMB over one flat
# vector or per leaf): a resume with another value is refused before the restore, even with
# allow_changes (Orbax would end in a tree mismatch).
LAYOUT = ("optimizer.flat",)


# the values of heads_jax.training.steps.DROPOUT_RNGS and heads_jax.model.heads.MLM_LOGITS
# (here without importing jax: the settings are checked before anything heavy is loaded)
DROPOUT_RNGS = ("threefry2x32", "rbg", "unsafe_rbg")
MLM_LOGITS = ("float32", "padded")


def check_training_config(config) -> None:
  """Refuses values no training run can use, before any data is read or device work done:
  ``batch_size`` and ``num_train_steps`` must be positive integers, the learning rate a finite
  number >= 0, ``optimizer.accumulate_steps`` and ``checkpoint.every_steps`` >= 1."""
  def positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise UserError(f"{name} must be a positive integer, got {value!r}: e.g. "
                      f"--config.{name}=16")
  positive_int("batch_size", config.batch_size)
  positive_int("num_train_steps", config.num_train_steps)
  if "eval_batch_size" in config:
    positive_int("eval_batch_size", config.eval_batch_size)
  o = config.optimizer
  if "accumulate_steps" in o:
    positive_int("optimizer.accumulate_steps", o.accumulate_steps)
  if "checkpoint" in config and "every_steps" in config.checkpoint:
    positive_int("checkpoint.every_steps", config.checkpoint.every_steps)
  lr = o.learning_rate
  if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
    raise UserError(f"optimizer.learning_rate must be a finite number >= 0, got {lr!r}: e.g. "
                    f"--config.optimizer.learning_rate=1e-4")
  for name, value, allowed in (("dropout_rng", config.get("dropout_rng"), DROPOUT_RNGS),
                               ("mlm_logits", config.get("mlm_logits"), MLM_LOGITS)):
    if value is not None and value not in allowed:
      raise UserError(f"{name} must be one of {', '.join(allowed)}, got {value!r}: e.g. "
                      f"--config.{name}={allowed[0]}")
  bits = config.model.get("dropout_bits", 32) if "model" in config else 32
  if bits not in (8, 16, 32):
    raise UserError(f"model.dropout_bits must be 8, 16 or 32 (random bits per dropout-mask "
                    f"element), got {bits!r}: e.g. --config.model.dropout_bits=8")
  if o.get("flat", False) and o.get("name", "lamb") != "lamb":
    raise UserError(f"optimizer.flat exists for LAMB only (optimizer.name is {o.name!r}): set "
                    f"--config.optimizer.flat=false")


def flat(d: dict, prefix: str = "") -> dict:
  """``{"a.b": value}`` of a nested dict (JSON values)."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _jsonable(config) -> dict:
  return json.loads(json.dumps(config.to_dict(), default=str))


def _skip(key: str) -> bool:
  return any(key == f or key.startswith(f + ".") for f in OPERATIONAL + DATA_PATHS)


def _kind(d: dict) -> str:
  return f"a fine-tuning run of task {d['task']}" if "task" in d else "a pre-training run"


def check_resume(config, config_file, changes_file, *, resumable: bool) -> dict | None:
  """Compares ``config`` with the settings a run in this directory was started with
  (``config_file``, plus the changes recorded in ``changes_file``); returns the changes to record
  (``{field: [before, now]}``, None when there is nothing to write but ``config_file``).

  Refused (a ``UserError``): a ``config_file`` that is not a training run's config; a run of
  another kind or task, or of another model (``FIXED``); other changed settings when the run has
  something to resume from (``resumable``) unless ``config.allow_changes``."""
  if not storage.exists(config_file):
    return None
  shown = storage.display(config_file)
  try:
    first = json.loads(storage.read_text(config_file))
  except ValueError as e:
    raise UserError(f"{shown} is not JSON ({e}); it is not this run's config: choose another "
                    f"--workdir") from None
  if not isinstance(first, dict) or "num_train_steps" not in first:
    raise UserError(f"{storage.display(storage.as_path(config_file).parent)} holds a config.json "
                    f"that is not a training run's (a model or another job's directory?): choose "
                    f"another --workdir")
  now = _jsonable(config)
  if ("task" in first) != ("task" in now) or first.get("task") != now.get("task"):
    raise UserError(f"{storage.display(storage.as_path(config_file).parent)} is {_kind(first)}; "
                    f"this is {_kind(now)}: choose another --workdir (resuming would continue "
                    f"the other run)")
  before = flat(first)
  if storage.exists(changes_file):
    for line in storage.read_text(changes_file).splitlines():
      if line.strip():
        before.update({k: v[1] for k, v in json.loads(line).get("changes", {}).items()})
  after = flat(now)
  changed = {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))
             if not _skip(k) and before.get(k) != after.get(k)}
  if not changed or not resumable:
    return changed if resumable else None
  listed = ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in list(changed.items())[:6])
  listed += f" and {len(changed) - 6} more" if len(changed) > 6 else ""
  fixed = [k for k in changed if any(k == f or k.startswith(f + ".") for f in FIXED)]
  where = storage.display(storage.as_path(config_file).parent)
  if fixed:
    raise UserError(f"{where}: this run was started with other model settings ({listed}); its "
                    f"checkpoints hold that model: choose another --workdir")
  layout = [k for k in changed if k in LAYOUT]
  if layout:
    k = layout[0]
    raise UserError(f"{where}: {k} {changed[k][0]!r} -> {changed[k][1]!r} changes the layout of "
                    f"the optimizer state its checkpoints hold, so they cannot be restored with "
                    f"it (allow_changes or not): resume with --config.{k}={changed[k][0]!r}, or "
                    f"start the new setting in another --workdir")
  if not config.get(ALLOW_CHANGES, False):
    raise UserError(f"{where}: this run was started with other settings ({listed}); resuming "
                    f"would mix them: rerun with the same settings, choose another --workdir, or "
                    f"pass --config.allow_changes=true to resume with the changes (recorded)")
  return changed


def record_changes(changes_file, changes: dict, step: int | None = None, *,
                   data: dict | None = None) -> None:
  """Appends one record of ``changes`` (and of a change of the training ``data``: its identity
  before and now) to ``changes_file`` (JSON lines; a URL is rewritten)."""
  old = storage.read_text(changes_file) if storage.exists(changes_file) else ""
  record = {"time": _dt.datetime.now().isoformat(timespec="seconds"), "resumed_at_step": step,
            "changes": changes}
  if data is not None:
    record["data"] = data
  line = json.dumps(record, default=str)
  write_text(changes_file, old + line + "\n")
