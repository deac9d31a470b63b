"""The ``heads-jax`` console command: one thin subcommand per capability.

Each subcommand parses its flags and calls a library function; nothing else lives here.
Errors a user can fix (a missing path, a bad data spec, ...) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

import heads_jax
from heads_jax.errors import UserError

# name -> (module, help). Each module has `add_args(parser)` and `main(args) -> int | None`.
SUBCOMMANDS = {
    "demo": ("heads_jax.demo_cli", "the paper's pipeline in miniature on embedded data (pre-train, fine-tune, analyse, compare)"),
    "pretrain": ("heads_jax.training.pretrain", "pre-train BERT (MLM + NSP) with LAMB, data-parallel, resumable"),
    "finetune": ("heads_jax.training.finetune", "fine-tune BERT on a GLUE task (MRPC, QQP, SST-2, QNLI) with LAMB"),
    "analyze": ("heads_jax.analysis_cli", "analyse the attention heads of a BERT model (sieve bias, tests, roles, clusters, report)"),
    "compare": ("heads_jax.compare_cli", "compare two analyses (before/after fine-tuning, or two models)"),
    "ablate": ("heads_jax.ablation.cli", "ablate heads of a fine-tuned classifier: groups, intra/inter attention, importance, pruning"),
    "convert": ("heads_jax.model.convert_cli", "convert a Hugging Face BERT directory <-> a heads_jax model directory"),
}


def build_parser() -> argparse.ArgumentParser:
  import importlib
  parser = argparse.ArgumentParser(prog="heads-jax", description=(
      "BERT attention-head analysis in JAX: the heads hypothesis (Pande et al. 2021) and "
      "distance-feature clustering (Guan et al. 2020), with pre-training and GLUE fine-tuning."))
  parser.add_argument("--version", action="version", version=f"heads-jax {heads_jax.__version__}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  for name, (module, help_) in SUBCOMMANDS.items():
    mod = importlib.import_module(module)
    p = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip().splitlines()[0])
    mod.add_args(p)
    p.set_defaults(_main=mod.main)
  return parser


def enable_compilation_cache() -> None:
  """JAX's persistent compilation cache, so re-runs skip XLA compilation (measured: an analysis
  of 128 sentences 16.9 s -> 3.6 s on a 2-core CPU; training restarts skip 12-36 s). Directory:
  ``$HEADS_JAX_CACHE_DIR`` (default ``~/.cache/heads_jax/xla``); ``HEADS_JAX_CACHE_DIR=off``
  disables it."""
  import os
  d = os.environ.get("HEADS_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "heads_jax", "xla"))
  if d.lower() in ("off", "0", "none", ""):
    return
  import jax
  jax.config.update("jax_compilation_cache_dir", d)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv=None) -> int:
  from heads_jax.training.configlib import split_config_overrides
  parser = build_parser()
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in ("pretrain", "finetune"):  # ml_collections style --config.key=value
    rest, overrides = split_config_overrides(argv)
    argv = rest + [x for o in overrides for x in ("--set", o)]
  args = parser.parse_args(argv)
  if not getattr(args, "_main", None):
    parser.print_help()
    return 1
  enable_compilation_cache()
  try:
    return int(args._main(args) or 0)
  except (UserError, FileNotFoundError, NotADirectoryError, FileExistsError) as e:
    print(f"heads-jax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except ValueError as e:
    if getattr(args, "debug", False):
      raise
    print(f"heads-jax {args.command}: error: {e}", file=sys.stderr)
    return 2
  except Exception as e:  # out of memory on the device or host: say what to change
    if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e) or "Out of memory" in str(e):
      size = getattr(args, "batch_size", None)
      hint = (f"try a smaller --batch-size (e.g. {max(1, size // 2)})" if size else
              "try a smaller batch size (--config.batch_size=...)")
      print(f"heads-jax {args.command}: error: out of memory; {hint}", file=sys.stderr)
      return 2
    raise
  except KeyboardInterrupt:
    print(f"heads-jax {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
