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
import importlib.util
import json
import sys
from pathlib import Path

import ml_collections

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def load_config(spec: str, overrides=()) -> ml_collections.ConfigDict:
  """``spec`` = ``path/to/file.py[:arg]`` (a bare name like ``pretrain.py`` is looked up in the
  repository's ``configs/`` folder); returns the config with ``overrides`` applied."""
  path, _, arg = str(spec).partition(":")
  p = Path(path)
  if not p.is_file() and (REPO_CONFIGS / p.name).is_file():
    p = REPO_CONFIGS / p.name
  if not p.is_file():
    raise FileNotFoundError(f"config file {path} does not exist; pass e.g. "
                            f"configs/pretrain.py:tiny (a Python file defining get_config)")
  module_spec = importlib.util.spec_from_file_location(f"_heads_jax_config_{p.stem}", p)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"{p} defines no get_config(arg) function")
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
      raise ValueError(f"config override {item!r} must look like key.sub=value")
    key, _, text = item.partition("=")
    key = key.lstrip("-")
    if key.startswith("config."):
      key = key[len("config."):]
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
      if part not in node:
        raise KeyError(f"config has no field {key!r} (no {part!r})")
      node = node[part]
    last = parts[-1]
    if last not in node:
      raise KeyError(f"config has no field {key!r}; fields here: {sorted(node.keys())}")
    value = parse_value(text)
    old = node[last]
    if isinstance(old, str) and not isinstance(value, str):
      value = text  # e.g. a path made of digits stays a string
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    try:
      node[last] = value
    except TypeError as e:
      raise TypeError(f"config override {item!r}: {e}") from None
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
        raise ValueError(f"{a} needs a value")
    else:
      rest.append(a)
    i += 1
  return rest, overrides


def add_config_args(parser, default_config: str) -> None:
  """``--config FILE[:ARG]``, ``--workdir DIR``, ``--set key=value`` (repeatable) and trailing
  ``key=value`` overrides."""
  parser.add_argument("--config", default=default_config,
                      help=f"config file and preset, e.g. {default_config} (default)")
  parser.add_argument("--workdir", required=True,
                      help="run directory: checkpoints, metrics.jsonl, TensorBoard files, exports; "
                           "an existing run there is resumed")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field (repeatable), e.g. --set batch_size=64; "
                           "--config.batch_size=64 works too")
  parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                      help="more config overrides, e.g. optimizer.learning_rate=1e-4")
  parser.add_argument("--print-config", action="store_true", help="print the config and exit")


def config_from_args(args) -> ml_collections.ConfigDict:
  overrides = list(getattr(args, "set", []) or []) + list(getattr(args, "overrides", []) or [])
  overrides += list(getattr(args, "config_overrides", []) or [])
  return load_config(args.config, overrides)


def save_config(config: ml_collections.ConfigDict, path) -> None:
  Path(path).parent.mkdir(parents=True, exist_ok=True)
  Path(path).write_text(json.dumps(config.to_dict(), indent=2, default=str))


def main_with_overrides(main, argv=None):
  """Runs ``main(argv)`` after moving ``--config.key=value`` items to ``--set``."""
  argv = sys.argv[1:] if argv is None else argv
  rest, overrides = split_config_overrides(argv)
  for o in overrides:
    rest += ["--set", o]
  return main(rest)


def entry_point(args, run_main, add_args, description: str) -> int:
  """The shared ``main`` of the training jobs: ``args`` is a parsed namespace (the ``heads-jax``
  subcommand) or an argv list / None (``python train/*.py``, ``--config.key=value`` allowed)."""
  import argparse
  import logging
  import os
  # The batches are built in a background thread while XLA keeps every core busy; the Rust
  # tokenizer's own thread pool then only adds contention (measured: 1.3-1.6x slower batches).
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  if isinstance(args, argparse.Namespace):
    return run_main(args)
  parser = argparse.ArgumentParser(description=description)
  add_args(parser)
  logging.basicConfig(level=logging.INFO)
  return main_with_overrides(lambda rest: run_main(parser.parse_args(rest)), args)
