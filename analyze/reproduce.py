"""Reproduce Pande et al. (AAAI 2021) end to end: pre-trained model, fine-tuning grid per task,
analyses before and after fine-tuning, comparison, and one report beside the papers' numbers.

  heads-jax reproduce --config configs/reproduce.py:cpu --workdir runs/reproduce_cpu
  heads-jax reproduce --config configs/reproduce.py:paper --workdir runs/paper \\
      --config.pretrained.path=path/to/bert-base-uncased
  heads-jax reproduce --config configs/reproduce.py:cpu --workdir runs/r --config.tasks=mrpc \\
      --config.test_sequences=20 --redo analysis

Every stage writes under --workdir; a unit whose settings and inputs (their content) did not
change is reused, so the same command continues a killed run and redoes only what a change
reaches; --redo STAGE does one stage again (and what reads it). The config names the
pipeline (config.pipeline): Pande et al.'s (pande) or Guan et al.'s (guan). Thin entry point
over ``heads_jax.pipelines.reproduce.run_reproduce``.
"""

from __future__ import annotations

import sys

from heads_jax.training import configlib

DEFAULT_CONFIG = "configs/reproduce.py:cpu"
# config.pipeline -> the function that runs it (imported when chosen)
PIPELINES = {"pande": "heads_jax.pipelines.reproduce:run_reproduce",
             "guan": "heads_jax.pipelines.guan:run_guan"}
from heads_jax.pipelines import names


def add_args(p):
  configlib.add_config_args(p, DEFAULT_CONFIG)
  p.add_argument("--redo", default=None, metavar="STAGE",
                 help="run STAGE again, and every later stage that reads it: "
                      f"{', '.join(names.REPRODUCE)}, or all; Guan et al.'s pipeline: "
                      f"{', '.join(names.GUAN)}, or all (default: a rerun reuses every part "
                      "whose settings and inputs are unchanged)")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  config = configlib.load_config(args.config, args.overrides)
  if args.print_config:
    print(config)
    return 0
  name = config.get("pipeline", "pande")
  if name not in PIPELINES:
    from heads_jax.errors import UserError
    raise UserError(f"config.pipeline={name!r}: one of {', '.join(PIPELINES)}")
  import importlib
  module, function = PIPELINES[name].split(":")
  getattr(importlib.import_module(module), function)(config, args.workdir, redo=args.redo)
  return 0


if __name__ == "__main__":
  from heads_jax import cli
  sys.exit(cli.main(["reproduce", *sys.argv[1:]]))
