"""Every environment variable heads_jax reads, documented and read here (and nowhere else).

Library code asks ``env.get(NAME)``: the variable's value, or its default when unset. A name
not in ``VARIABLES`` is a KeyError, so a new variable cannot be read without being listed (and
so documented) here. ``heads-jax doctor`` prints the ones that are set.

Values are checked where they are read: ``get`` refuses a set value of the wrong form (a number
that is not one, a choice that is not one of its values, a directory that names a file) with one
``UserError`` line naming the variable, its value and what it takes (``problem``); ``check()``
lists every such problem of the environment at once (and, with ``paths=True``, set paths that do
not exist), for ``heads-jax doctor`` and for a job to refuse a bad value at its start
(``require_valid``).

=========================  =====================================================================
variable                   meaning (default)
=========================  =====================================================================
HEADS_JAX_CACHE_DIR        the ``heads-jax`` command's persistent XLA compilation cache directory
                           (``~/.cache/heads_jax/xla``); ``off`` disables it
HEADS_JAX_REMOTE_CACHE     local copies of ``gs://`` inputs (``~/.cache/heads_jax/remote``)
HEADS_JAX_STORAGE_TIMEOUT  seconds a call to remote storage (``gs://``: heads_jax's own calls, Orbax,
                           TensorStore) may wait before the job stops with one line and exit 2
                           (``300``); a progress line names the path after
                           HEADS_JAX_STORAGE_PROGRESS seconds (``30``) (``heads_jax.storage``)
HEADS_JAX_STORAGE_PROGRESS seconds of waiting on storage before a progress line (``30``)
HEADS_JAX_XLA_FLAGS        ``off`` keeps heads_jax's default XLA flags out of ``XLA_FLAGS``
                           (``heads_jax.xla_flags``)
HEADS_JAX_STATS_IMPL       forces the analysis step's statistics path where ``stats_impl`` is
                           ``auto``: ``layerwise`` (per-layer XLA), ``fused`` (the first Pallas
                           kernel, GPUs), ``kernel`` (statistics kernel v2: Triton on GPUs,
                           Mosaic on TPUs) or ``stacked`` (unset: the platform's default,
                           ``heads_jax.stats.step``)
HEADS_JAX_GLUE_DIR         the GLUE TSV folders of the fine-tuning and reproduce configs
                           (``../shared/data/glue``, see "Shared data" below)
HEADS_JAX_SQUAD_FILE       the SQuAD 2.0 JSON of the fine-tuning configs' SQuAD presets
                           (``../shared/data/squad/dev-v2.0-first5.json``)
HEADS_JAX_GUTENBERG        the books folder of the pre-training configs
                           (``../shared/data/corpus/gutenberg``)
TFDS_DATA_DIR              TensorFlow Datasets' data folder (``~/tensorflow_datasets``): TFDS reads
                           it; heads_jax reads it to key ``glue:`` and ``squad-tfds:`` data by the
                           content of their prepared files (``heads_jax.runfiles.tfds_files``)
HEADS_JAX_CORPUS           the prepared corpus of the ``bert_base`` pre-training presets
                           (``corpus/paper``)
XLA_FLAGS                  XLA's flags; heads_jax adds its per-platform defaults to it, the
                           user's entries win (``heads_jax.xla_flags``)
JAX_PLATFORMS              JAX's platform choice; read (not set) to pick the default XLA flags
                           before JAX starts
TOKENIZERS_PARALLELISM     the Rust tokenizers' thread pool; the ``heads-jax`` command sets it
                           to ``false`` unless set (batches are built beside busy XLA threads)
HF_HUB_OFFLINE             ``1``: hub ids are looked up in the Hugging Face cache only
HF_HUB_CACHE, HF_HOME      where that cache is (``$HF_HOME/hub``, ``~/.cache/huggingface/hub``)
=========================  =====================================================================

Shared data: the three data defaults above are no machine's absolute paths. ``shared_default``
looks for ``shared/<path>`` beside the checkout that holds this package (``../shared`` of a clone,
as README says), then beside the working directory (a non-editable install run from the clone),
and takes the first that exists; when neither does, the default is the checkout's
``../shared/<path>``, and the job that reads it stops with one line naming the variable to set
(``missing_shared``).

Read by the libraries themselves, not by heads_jax: ``LIBTPU_INIT_ARGS`` (TPU compiler flags), ``JAX_*`` (``jax.config``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from heads_jax.errors import UserError

# Defaults of this form are paths in the shared data folder beside the checkout (``shared_default``).
_SHARED = "../shared/"


class Variable(NamedTuple):
  """A documented environment variable: its default (None: none) and one-line description."""
  default: str | None
  description: str


# name -> Variable; the table above in data form.
VARIABLES = {
    "HEADS_JAX_CACHE_DIR": Variable(
        os.path.join("~", ".cache", "heads_jax", "xla"),
        "persistent XLA compilation cache of the heads-jax command; off disables"),
    "HEADS_JAX_REMOTE_CACHE": Variable(os.path.join("~", ".cache", "heads_jax", "remote"),
                                       "local copies of gs:// inputs"),
    "HEADS_JAX_STORAGE_TIMEOUT": Variable("300", "seconds a storage call may wait before exit 2"),
    "HEADS_JAX_STORAGE_PROGRESS": Variable("30", "seconds of waiting on storage before a progress line"),
    "HEADS_JAX_XLA_FLAGS": Variable("", "off: do not add heads_jax's default XLA flags"),
    "HEADS_JAX_STATS_IMPL": Variable(
        "", "force the analysis statistics path (layerwise, fused, kernel, stacked)"),
    "HEADS_JAX_GLUE_DIR": Variable(_SHARED + "data/glue", "GLUE TSV folders of the configs"),
    "HEADS_JAX_SQUAD_FILE": Variable(_SHARED + "data/squad/dev-v2.0-first5.json",
                                     "SQuAD 2.0 JSON of the fine-tuning configs"),
    "HEADS_JAX_GUTENBERG": Variable(_SHARED + "data/corpus/gutenberg", "books of the pre-training configs"),
    "TFDS_DATA_DIR": Variable(os.path.join("~", "tensorflow_datasets"),
                              "TensorFlow Datasets' data folder (glue:, squad-tfds: data)"),
    "HEADS_JAX_CORPUS": Variable("corpus/paper", "prepared corpus of the bert_base pre-training presets"),
    "XLA_FLAGS": Variable("", "XLA flags (heads_jax adds its per-platform defaults; yours win)"),
    "JAX_PLATFORMS": Variable("", "JAX's platform choice (read to pick the default XLA flags)"),
    "TOKENIZERS_PARALLELISM": Variable("", "tokenizers' thread pool (heads-jax sets false unless set)"),
    "HF_HUB_OFFLINE": Variable("", "1: Hugging Face hub ids from the local cache only"),
    "HF_HUB_CACHE": Variable("", "the Hugging Face hub cache directory"),
    "HF_HOME": Variable("", "the Hugging Face home ($HF_HOME/hub is the hub cache)"),
}

class BadValue(UserError, ValueError):
  """A documented variable set to a value of the wrong form (one line, exit 2)."""


_OFF = ("off", "0", "false", "no", "none")
_TRUE = ("1", "ON", "YES", "TRUE")
_SWITCH = ("", "1", "0", "on", "off", "yes", "no", "true", "false", "none")
_PLATFORMS = ("cpu", "cuda", "gpu", "rocm", "tpu", "metal")


def _positive_seconds(name: str, value: str) -> str | None:
  try:
    ok = 0 < float(value) < float("inf")
  except ValueError:
    ok = False
  return None if ok else f"{name} must be a positive number of seconds (e.g. 300), got {value!r}"


def _one_of(*choices: str):
  def check(name: str, value: str) -> str | None:
    if value.strip().lower() in choices:
      return None
    named = ", ".join(c for c in choices if c) + (" (or empty)" if "" in choices else "")
    return f"{name} must be one of {named}, got {value!r}"
  return check


def _directory(off: bool = False):
  def check(name: str, value: str) -> str | None:
    if off and value.strip().lower() in _OFF:
      return None
    path = os.path.expanduser(value)
    if os.path.exists(path) and not os.path.isdir(path):
      return (f"{name}={value} is a file, not a directory: point it at a directory or unset it"
              + (f", or set {name}=off" if off else ""))
    return None
  return check


def _platforms(name: str, value: str) -> str | None:
  bad = [p.strip() for p in value.lower().split(",") if p.strip() and p.strip() not in _PLATFORMS]
  return None if not bad else (f"{name}={value} names the unknown platform {bad[0]!r}; JAX takes "
                               f"a comma-separated list of {', '.join(_PLATFORMS)}")


# name -> the check of a set value's form: None when fine, else the line saying what is wrong
# and what the variable takes.
FORMS = {
    "HEADS_JAX_CACHE_DIR": _directory(off=True),
    "HEADS_JAX_REMOTE_CACHE": _directory(),
    "HEADS_JAX_STORAGE_TIMEOUT": _positive_seconds,
    "HEADS_JAX_STORAGE_PROGRESS": _positive_seconds,
    "HEADS_JAX_XLA_FLAGS": _one_of(*_SWITCH),
    "HEADS_JAX_STATS_IMPL": _one_of("", "layerwise", "fused", "stacked", "kernel"),
    "HEADS_JAX_GLUE_DIR": _directory(),
    "JAX_PLATFORMS": _platforms,
    "TOKENIZERS_PARALLELISM": _one_of(*_SWITCH),
    "HF_HUB_OFFLINE": _one_of(*_SWITCH),
    "HF_HUB_CACHE": _directory(),
    "HF_HOME": _directory(),
}
# Paths that must exist when set (checked by ``check(paths=True)``, i.e. by ``heads-jax doctor``;
# a job checks them where it reads them).
PATHS = {"HEADS_JAX_GLUE_DIR": "directory", "HEADS_JAX_SQUAD_FILE": "file",
         "HEADS_JAX_GUTENBERG": "directory"}


def problem(name: str, value: str) -> str | None:
  """The one line saying why ``value`` is no value of ``name``, or None when it is fine."""
  check = FORMS.get(name)
  return check(name, value) if check is not None else None


def check(environ=None, *, paths: bool = False) -> list[str]:
  """One line per documented variable set to a value of the wrong form (``problem``); with
  ``paths``, also per set path variable (``PATHS``) that does not exist. ``XLA_FLAGS``'s names
  are checked by ``heads_jax.xla_flags.unknown`` (it asks XLA)."""
  environ = os.environ if environ is None else environ
  out = []
  for name in VARIABLES:
    value = environ.get(name)
    if value is None:
      continue
    line = problem(name, value)
    if line is None and paths and name in PATHS and value:
      kind = PATHS[name]
      found = (os.path.isdir if kind == "directory" else os.path.isfile)(os.path.expanduser(value))
      if not found:
        line = f"{name}={value}: no such {kind}; point it at one or unset it"
    if line is not None:
      out.append(line)
  return out


def require_valid(environ=None) -> None:
  """Raises a ``UserError`` (one line) naming the first variable set to a bad value: for a job
  to refuse at its start what would stop it later."""
  problems = check(environ)
  if problems:
    more = f" (and {len(problems) - 1} more: heads-jax doctor lists them)" if len(problems) > 1 else ""
    raise BadValue(f"environment: {problems[0]}{more}")


def _known(name: str) -> None:
  if name not in VARIABLES:
    raise KeyError(f"{name} is not a documented heads_jax environment variable; add it to "
                   "heads_jax/env.py VARIABLES")


def get(name: str, environ=None) -> str:
  """The value of ``name`` (one of ``VARIABLES``) in ``environ`` (default ``os.environ``), or
  its default; a default starting with ``~`` is expanded. A set value of the wrong form is a
  ``UserError`` (``problem``)."""
  _known(name)
  environ = os.environ if environ is None else environ
  value = environ.get(name)
  if value is None:
    value = VARIABLES[name].default
    if value.startswith(_SHARED):
      return shared_default(value[len(_SHARED):])
    if value.startswith("~"):
      value = os.path.expanduser(value)
    return value
  line = problem(name, value)
  if line is not None:
    raise BadValue(f"environment: {line}")
  return value


def shared_default(relative: str, cwd: str | None = None) -> str:
  """``shared/<relative>`` beside this package's checkout, else beside the working directory
  (``cwd``), whichever exists first; the checkout's when neither does (module docstring)."""
  checkout = Path(__file__).resolve().parents[1]
  candidates = [checkout.parent / "shared" / relative,
                Path(cwd or os.getcwd()).resolve().parent / "shared" / relative]
  for path in candidates:
    if path.exists():
      return str(path)
  return str(candidates[0])


def missing_shared(name: str) -> str | None:
  """One line for a data variable (``HEADS_JAX_GLUE_DIR``, ...) whose path does not exist: which
  path was looked for and how to give one; None when it exists."""
  path = get(name)
  if os.path.exists(path):
    return None
  how = ("it is unset and no shared data folder was found beside the checkout or the working "
         "directory" if not is_set(name) else "no such path")
  return f"{name}={path}: {how}; set {name} to your copy (README, 'Data and licences')"


def is_set(name: str, environ=None) -> bool:
  """Whether ``name`` (one of ``VARIABLES``) is set to a non-empty value."""
  _known(name)
  return bool((os.environ if environ is None else environ).get(name, ""))


def is_off(name: str, environ=None) -> bool:
  """Whether ``name`` is set to off / 0 / false / no / none."""
  return get(name, environ).strip().lower() in _OFF


def is_true(name: str, environ=None) -> bool:
  """Whether ``name`` is set to 1 / on / yes / true (any case)."""
  return get(name, environ).strip().upper() in _TRUE


def set_default(name: str, value: str, environ=None) -> str:
  """Sets ``name`` to ``value`` unless it is set; returns the value in force."""
  _known(name)
  environ = os.environ if environ is None else environ
  return environ.setdefault(name, value)


def put(name: str, value: str, environ=None) -> None:
  """Sets ``name`` (one of ``VARIABLES``) to ``value``."""
  _known(name)
  (os.environ if environ is None else environ)[name] = value


def for_child(**values: str) -> dict:
  """A copy of this process's environment with ``values`` (documented variables) set: the
  environment of a child process."""
  for name in values:
    _known(name)
  return {**os.environ, **values}


def in_force(environ=None) -> dict:
  """``{name: value}`` of the documented variables that are set (for ``heads-jax doctor``)."""
  environ = os.environ if environ is None else environ
  return {name: environ[name] for name in VARIABLES if environ.get(name)}
