"""The ``heads-jax`` console command: dispatches each subcommand to its entry module.

The entry modules live at the top of the repository, ``train/`` (pretrain, finetune,
prepare_corpus) and
``analyze/`` (analyze, compare, ablate, convert, demo), installed as ``heads_jax.train`` and
``heads_jax.analyze``; each has ``add_args(parser)`` and ``main(args)`` (flags, then one library
call). This module and those are the entry layer: nothing in the library imports them.

Errors a user can fix (a missing path, a bad data spec, a bad config override, ...) print one
line on stderr and exit 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import re
import shutil
import sys
import textwrap
import warnings
import zipfile

import heads_jax
from heads_jax import env, xla_flags
from heads_jax.errors import UserError

# name -> (entry module, one-line help for the command list). The module is imported only when
# its command runs or shows its own help: `heads-jax --help` imports no job (and so no JAX).
SUBCOMMANDS = {
    "demo": ("heads_jax.analyze.demo", "the paper's pipeline in miniature on embedded data (pre-train, fine-tune, analyse, compare)"),
    "pretrain": ("heads_jax.train.pretrain", "pre-train BERT (MLM + NSP) with LAMB, data-parallel, resumable"),
    "finetune": ("heads_jax.train.finetune", "fine-tune BERT on a GLUE task or SQuAD with LAMB, resumable"),
    "prepare-corpus": ("heads_jax.train.prepare_corpus", "convert English Wikipedia (Parquet) and folders of books into the pre-training corpus, once"),
    "analyze": ("heads_jax.analyze.heads", "analyse the attention heads of a BERT model (sieve bias, tests, roles, clusters, report)"),
    "compare": ("heads_jax.analyze.compare", "compare two analyses (before/after fine-tuning, or two models)"),
    "ablate": ("heads_jax.analyze.ablate", "ablate heads of a fine-tuned classifier: groups, intra/inter attention, importance, pruning, attribution, patching"),
    "reproduce": ("heads_jax.analyze.reproduce", "Pande et al. (or Guan et al.) end to end: fine-tuning, analyses before/after, comparison, report beside the papers' numbers"),
    "trajectory": ("heads_jax.analyze.trajectory", "roles over training: analyse every kept checkpoint of a pre-training or fine-tuning run"),
    "convert": ("heads_jax.analyze.convert", "convert a Hugging Face BERT directory <-> a heads_jax model directory"),
    "tiny-model": ("heads_jax.analyze.tiny_model", "write a tiny random model of one family (BERT ... ModernBERT, DeBERTa-v3) to try the commands offline"),
    "doctor": ("heads_jax.analyze.doctor", "check this machine: devices, versions, every attention/analysis path against the float32 reference, BERT-base tokens/s and MFU"),
}

# Subcommands whose flags accept the ml_collections override syntax --config.key=value.
CONFIG_SUBCOMMANDS = ("pretrain", "finetune", "reproduce")


def describe(doc: str | None, fallback: str) -> tuple[str, str | None]:
  """A command's --help text from its entry module's docstring: the description is the first
  paragraph (whole sentences, re-wrapped); the epilog holds the indented example commands, as
  written. Developer notes ("Thin entry point over ...") are left out."""
  paras = [p.strip("\n") for p in re.split(r"\n\s*\n", (doc or "").strip())]
  prose = [" ".join(_THIN.sub("", p).replace("``", "").split()) for p in paras if not p.startswith("  ")]
  prose = [p for p in prose if p]
  if not prose:
    return fallback, None
  description = "\n\n".join(textwrap.fill(p, width=_width()) for p in prose)
  examples = [textwrap.dedent(p) for p in paras if p.startswith("  ")]
  epilog = "examples:\n" + textwrap.indent("\n".join(examples), "  ") if examples else None
  return description, epilog


_THIN = re.compile(r"\s*Thin\s+entry\s+point\s+over\s+``[\w.]+``\.")


def _width() -> int:
  return max(40, min(100, shutil.get_terminal_size((80, 24)).columns) - 2)


def presets(config_file: str) -> list[tuple[str, str]]:
  """(names, first sentence) of each ``* ``NAME``[ / ``NAME``]: text`` bullet in a shipped
  config file's docstring (read as text: the config is not imported)."""
  found = []
  for m in re.finditer(r"^\* (``\w+``[^:\n]*?): (.*?)(?=^\* |^\S|\Z)", _config_doc(config_file),
                       flags=re.S | re.M):
    names = ", ".join(re.findall(r"``(\w+)``", m.group(1)))
    text = " ".join(m.group(2).replace("``", "").replace("**", "").split())
    first = re.match(r"(.*?(?<!\bal)(?<!e\.g)(?<!i\.e)\.)(?:\s+[A-Z(*]|\s*$)", text)
    found.append((names, first.group(1) if first else text))
  return found


def _config_doc(config_file: str) -> str:
  from heads_jax.training.configlib import config_path  # light: ml_collections, no JAX
  doc = re.match(r'\s*"""(.*?)"""', config_path(config_file).read_text(), flags=re.S)
  return doc.group(1) if doc else ""


def _presets_epilog(config_file: str) -> str:
  rows = presets(config_file)
  if not rows:  # presets described in prose: the paragraphs that give the --config form
    paras = [" ".join(p.replace("``", "").split()) for p in re.split(r"\n\s*\n", _config_doc(config_file))]
    return "presets:\n" + "\n".join(textwrap.fill(p, width=_width(), initial_indent="  ", subsequent_indent="  ")
                                  for p in paras if p.startswith(("--config", "SQuAD:")))
  out = [f"presets (--config {config_file}:NAME):"]
  for names, text in rows:
    out.append(textwrap.fill(text, width=_width(), initial_indent=f"  {names}: ",
                             subsequent_indent="      "))
  return "\n".join(out)


def add_redo(p, stages, *, default_note: str = "a rerun reuses every part whose settings and "
             "inputs are unchanged") -> None:
  """The ``--redo STAGE|all`` flag of a job whose stages are ``stages`` (in pipeline order,
  `heads_jax.pipelines.names`), listed in its help; the job refuses another name in one line
  (``--redo 'x': one of ...``) before it writes anything."""
  p.add_argument("--redo", default=None, metavar="STAGE",
                 help="run STAGE again, and every later stage that reads it, although its "
                      f"settings and inputs did not change: {', '.join(stages)}, or all "
                      f"(default: {default_note})")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
  """The ``heads-jax`` parser. Every command is listed; only ``command``'s entry module is
  imported and its flags added (every command's when ``command`` is None, none when it is
  ""), so the help and argument errors of one command never import another's job."""
  parser = argparse.ArgumentParser(prog="heads-jax", description=(
      "BERT attention-head analysis in JAX: the heads hypothesis (Pande et al. 2021) and "
      "distance-feature clustering (Guan et al. 2020), with pre-training and GLUE fine-tuning."),
      epilog="`heads-jax COMMAND --help` describes a command.")
  parser.add_argument("--version", action="version", version=f"heads-jax {heads_jax.__version__}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  for name, (module, help_) in SUBCOMMANDS.items():
    if command is not None and name != command:
      sub.add_parser(name, help=help_, add_help=False)
      continue
    mod = importlib.import_module(module)
    description, epilog = describe(mod.__doc__, help_)
    if name in CONFIG_SUBCOMMANDS:
      default = getattr(mod, "DEFAULT_CONFIG", None)
      listed = _presets_epilog(default.partition(":")[0]) if default else ""
      epilog = "\n\n".join(x for x in (epilog, listed) if x) or None
    p = sub.add_parser(name, help=help_, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_args(p)
    p.set_defaults(_main=mod.main, _check=getattr(mod, "check", None))
  return parser


def backend_message(e: BaseException) -> str | None:
  """The one line for JAX failing to start a backend (``JAX_PLATFORMS`` naming a platform this
  machine lacks, a missing plugin), or None when ``e`` is something else. JAX raises a
  RuntimeError "Unable to initialize backend ..." (or, for a platform whose plugin is absent,
  a bare AssertionError) from ``jax/_src/xla_bridge.py``."""
  text = str(e)
  tb = e.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  in_bridge = tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("jax/_src/xla_bridge.py")
  if not (text.startswith("Unable to initialize backend") or (in_bridge and isinstance(e, (RuntimeError, AssertionError)))):
    return None
  platforms = env.get("JAX_PLATFORMS")
  cause = re.sub(r"\s*\(set JAX_PLATFORMS='' to automatically choose an available backend\)", "", text)
  cause = cause.removeprefix("Unable to initialize backend ").strip() or "no such platform is installed here"
  where = f"JAX_PLATFORMS={platforms}" if platforms else "the default platform"
  return (f"JAX could not start a backend for {where} ({cause}); unset JAX_PLATFORMS to use the "
          f"devices this machine has, or install the platform's JAX plugin (pip install "
          f"'jax[cuda12]' or 'jax[tpu]')")


# Numerical warnings that only say a statistic is NaN where there is nothing to average (a role
# with no token pairs on a small sample, a head with one value): the NaN is the result, and the
# reports say "not computed" there.
HARMLESS_WARNINGS = (
    (RuntimeWarning, r"Mean of empty slice"),
    (RuntimeWarning, r"All-NaN slice encountered"),
    (RuntimeWarning, r"Degrees of freedom <= 0"),
    (RuntimeWarning, r"invalid value encountered in (divide|scalar divide|true_divide|subtract|multiply)"),
    (RuntimeWarning, r"divide by zero encountered"),
    (RuntimeWarning, r"Precision loss occurred in moment calculation"),
)
# Lines other libraries log on every run that say nothing about this run.
_LIBRARY_CHATTER = re.compile(r"PyTorch was not found|TensorFlow was not found|"
                              r"None of PyTorch, TensorFlow .* have been found")


class _DropChatter(logging.Filter):
  def filter(self, record):
    return not _LIBRARY_CHATTER.search(record.getMessage())


def quiet_console(command: str) -> None:
  """A normal run's console holds heads_jax's lines only: a Python warning is one plain line
  (``heads-jax CMD: warning: ...``, no source line), the harmless numerical ones and libraries'
  deprecation notices are silenced, transformers' "PyTorch was not found" advice (a JAX
  package needs no PyTorch) and absl's (Orbax's) info and warning lines are dropped. Errors
  still show. ``--debug`` keeps everything as the libraries print it."""
  def one_line(message, category, filename, lineno, file=None, line=None):
    text = " ".join(str(message).split())
    print(f"heads-jax {command}: warning: {text}", file=file or sys.stderr)
  warnings.showwarning = one_line
  for category, pattern in HARMLESS_WARNINGS:
    warnings.filterwarnings("ignore", message=pattern, category=category)
  for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
    warnings.filterwarnings("ignore", category=category)  # for developers: pytest shows them
  logging.getLogger("transformers").addFilter(_DropChatter())
  logging.getLogger("absl").setLevel(logging.ERROR)


def enable_compilation_cache() -> None:
  """JAX's persistent compilation cache, so re-runs skip XLA compilation (measured: an analysis
  of 128 sentences 16.9 s -> 3.6 s on a 2-core CPU; training restarts skip 12-36 s). Directory:
  ``$HEADS_JAX_CACHE_DIR`` (default ``~/.cache/heads_jax/xla``); ``HEADS_JAX_CACHE_DIR=off``
  disables it."""
  d = env.get("HEADS_JAX_CACHE_DIR")
  if d.lower() in ("off", "0", "none", ""):
    return
  if "://" not in d:  # a local directory: made here, so a bad one is named before any work
    path = os.path.expanduser(d)
    if os.path.exists(path) and not os.path.isdir(path):
      raise UserError(f"HEADS_JAX_CACHE_DIR={d} is a file, not a directory: point it at a "
                      f"directory for the compilation cache, or set HEADS_JAX_CACHE_DIR=off")
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      raise UserError(f"HEADS_JAX_CACHE_DIR={d}: cannot create the compilation cache directory "
                      f"({e.strerror}); point it at a writable directory, or set "
                      f"HEADS_JAX_CACHE_DIR=off") from None
    if not os.access(path, os.W_OK | os.X_OK):
      raise UserError(f"HEADS_JAX_CACHE_DIR={d} is not writable: point it at a writable "
                      f"directory, or set HEADS_JAX_CACHE_DIR=off")
  import jax  # here, not at the top: `heads-jax --help` and argument errors stay fast
  jax.config.update("jax_compilation_cache_dir", d)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _error(command, message) -> int:
  print(f"heads-jax {command}: error: {message}", file=sys.stderr)
  return 2


# OSErrors a user can fix (besides the FileNotFound/NotADirectory/FileExists family).
_USER_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted", errno.EISDIR: "is a directory",
                errno.ENOTDIR: "not a directory", errno.EEXIST: "already exists",
                errno.ENOENT: "does not exist", errno.ENAMETOOLONG: "file name too long"}
_FIX = {errno.ENOSPC: "free some space or choose another output directory; the files written "
                      "before stay, and the same command continues or redoes the run",
        errno.EDQUOT: "free some space or choose another output directory",
        errno.EROFS: "choose a writable output directory",
        errno.EACCES: "check its permissions, or choose another path",
        errno.EPERM: "check its permissions, or choose another path",
        errno.EEXIST: "give a directory, or another path"}


def user_message(e: BaseException) -> str | None:
  """The one line for an error a user can fix, or None for a bug (the traceback stays): a
  UserError or ValueError as it is; an OSError with its path and what to do (raw ``[Errno N]``
  text is rewritten); a damaged archive (zip/npz)."""
  if isinstance(e, (UserError, ValueError)):
    return str(e)
  if isinstance(e, zipfile.BadZipFile):
    return f"a damaged archive ({e}): the file is truncated or not what it should be; write it again"
  if isinstance(e, OSError) and (e.errno in _USER_ERRNOS or isinstance(
      e, (FileNotFoundError, NotADirectoryError, FileExistsError, PermissionError))):
    if e.filename is None or not str(e).startswith("[Errno"):
      return str(e)  # already a sentence of ours
    what = _USER_ERRNOS.get(e.errno, e.strerror or "error")
    path = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
    fix = _FIX.get(e.errno)
    return f"{path}: {what}" + (f"; {fix}" if fix else "")
  return None


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    if argv and argv[0] in CONFIG_SUBCOMMANDS:
      from heads_jax.training.configlib import split_config_overrides
      rest, overrides = split_config_overrides(argv)
      argv = rest + [x for o in overrides for x in ("--set", o)]
  except UserError as e:
    return _error(argv[0], e)
  parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else "")
  args = parser.parse_args(argv)
  if not getattr(args, "_main", None):
    parser.print_help()
    return 1
  # The training jobs build batches in a background thread while XLA keeps every core busy; the
  # Rust tokenizer's own thread pool then only adds contention (measured: 1.3-1.6x slower batches).
  env.set_default("TOKENIZERS_PARALLELISM", "false")
  debug = getattr(args, "debug", False)
  if not debug:
    quiet_console(args.command)
  try:
    if getattr(args, "_check", None):  # the entry's checks that need no JAX: a refusal in ~1 s
      args._check(args)
    if args.command != "doctor":  # doctor lists every bad variable itself (and exits 1)
      env.require_valid()  # a bad value refused before the work, not where it is first read
      xla_flags.require_known()  # an unknown XLA flag: one line, not XLA's fatal abort
    try:
      xla_flags.apply()  # before any JAX backend exists (heads_jax/xla_flags.py)
      enable_compilation_cache()
    except env.BadValue:
      if args.command != "doctor":
        raise
    return int(args._main(args) or 0)
  except (UserError, ValueError, OSError, zipfile.BadZipFile) as e:
    message = None if debug else user_message(e)
    if message is None:
      raise
    return _error(args.command, message)
  except KeyboardInterrupt:
    print(f"heads-jax {args.command}: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # no backend, or out of memory on the device or host: say what to change
    backend = None if debug else backend_message(e)
    if backend is not None:
      return _error(args.command, backend)
    if debug or not (isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e) or "Out of memory" in str(e)):
      raise
    size = getattr(args, "batch_size", None)
    hint = (f"try a smaller --batch-size (e.g. {max(1, size // 2)})" if size else
            "try a smaller batch size (--config.batch_size=...)")
    return _error(args.command, f"out of memory; {hint}")


if __name__ == "__main__":
  sys.exit(main())
