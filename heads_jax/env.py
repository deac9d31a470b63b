"""Every environment variable heads_jax reads, documented and read here (and nowhere else).

Library code asks ``env.get(NAME)``: the variable's value, or its default when unset. A name
not in ``VARIABLES`` is a KeyError, so a new variable cannot be read without being listed (and
so documented) here. ``heads-jax doctor`` prints the ones that are set.

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
                           ``auto``: ``layerwise`` (per-layer XLA), ``fused`` (Pallas kernel,
                           GPUs) or ``stacked`` (unset: the platform's default,
                           ``heads_jax.stats.step``)
HEADS_JAX_GLUE_DIR         the GLUE TSV folders of the fine-tuning and reproduce configs
                           (``/work/shared/data/glue``)
HEADS_JAX_SQUAD_FILE       the SQuAD 2.0 JSON of the fine-tuning configs' SQuAD presets
                           (``/work/shared/data/squad/dev-v2.0-first5.json``)
HEADS_JAX_GUTENBERG        the books folder of the pre-training configs
                           (``/work/shared/data/corpus/gutenberg``)
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

Read by the libraries themselves, not by heads_jax: ``TFDS_DATA_DIR`` (TensorFlow Datasets'
data directory, for ``tfds:`` and ``glue:`` data; ``--config.data.tfds_data_dir`` overrides it),
``LIBTPU_INIT_ARGS`` (TPU compiler flags), ``JAX_*`` (``jax.config``).
"""

from __future__ import annotations

import os

# name -> (default or None, one-line description); the table above in data form.
VARIABLES = {
    "HEADS_JAX_CACHE_DIR": (os.path.join("~", ".cache", "heads_jax", "xla"),
                            "persistent XLA compilation cache of the heads-jax command; off disables"),
    "HEADS_JAX_REMOTE_CACHE": (os.path.join("~", ".cache", "heads_jax", "remote"),
                               "local copies of gs:// inputs"),
    "HEADS_JAX_STORAGE_TIMEOUT": ("300", "seconds a storage call may wait before exit 2"),
    "HEADS_JAX_STORAGE_PROGRESS": ("30", "seconds of waiting on storage before a progress line"),
    "HEADS_JAX_XLA_FLAGS": ("", "off: do not add heads_jax's default XLA flags"),
    "HEADS_JAX_STATS_IMPL": ("", "force the analysis statistics path (layerwise, fused, stacked)"),
    "HEADS_JAX_GLUE_DIR": ("/work/shared/data/glue", "GLUE TSV folders of the configs"),
    "HEADS_JAX_SQUAD_FILE": ("/work/shared/data/squad/dev-v2.0-first5.json",
                             "SQuAD 2.0 JSON of the fine-tuning configs"),
    "HEADS_JAX_GUTENBERG": ("/work/shared/data/corpus/gutenberg", "books of the pre-training configs"),
    "HEADS_JAX_CORPUS": ("corpus/paper", "prepared corpus of the bert_base pre-training presets"),
    "XLA_FLAGS": ("", "XLA flags (heads_jax adds its per-platform defaults; yours win)"),
    "JAX_PLATFORMS": ("", "JAX's platform choice (read to pick the default XLA flags)"),
    "TOKENIZERS_PARALLELISM": ("", "tokenizers' thread pool (heads-jax sets false unless set)"),
    "HF_HUB_OFFLINE": ("", "1: Hugging Face hub ids from the local cache only"),
    "HF_HUB_CACHE": ("", "the Hugging Face hub cache directory"),
    "HF_HOME": ("", "the Hugging Face home ($HF_HOME/hub is the hub cache)"),
}

_OFF = ("off", "0", "false", "no", "none")
_TRUE = ("1", "ON", "YES", "TRUE")


def get(name: str, environ=None) -> str:
  """The value of ``name`` (one of ``VARIABLES``) in ``environ`` (default ``os.environ``), or
  its default; a default starting with ``~`` is expanded."""
  if name not in VARIABLES:
    raise KeyError(f"{name} is not a documented heads_jax environment variable; add it to "
                   "heads_jax/env.py VARIABLES")
  environ = os.environ if environ is None else environ
  value = environ.get(name)
  if value is None:
    value = VARIABLES[name][0]
    if value.startswith("~"):
      value = os.path.expanduser(value)
  return value


def is_set(name: str, environ=None) -> bool:
  """Whether ``name`` (one of ``VARIABLES``) is set to a non-empty value."""
  get(name, environ)  # checks the name
  return bool((os.environ if environ is None else environ).get(name, ""))


def is_off(name: str, environ=None) -> bool:
  """Whether ``name`` is set to off / 0 / false / no / none."""
  return get(name, environ).strip().lower() in _OFF


def is_true(name: str, environ=None) -> bool:
  """Whether ``name`` is set to 1 / on / yes / true (any case)."""
  return get(name, environ).strip().upper() in _TRUE


def set_default(name: str, value: str, environ=None) -> str:
  """Sets ``name`` to ``value`` unless it is set; returns the value in force."""
  get(name, environ)
  environ = os.environ if environ is None else environ
  return environ.setdefault(name, value)


def put(name: str, value: str, environ=None) -> None:
  """Sets ``name`` (one of ``VARIABLES``) to ``value``."""
  get(name, environ)
  (os.environ if environ is None else environ)[name] = value


def in_force(environ=None) -> dict:
  """``{name: value}`` of the documented variables that are set (for ``heads-jax doctor``)."""
  environ = os.environ if environ is None else environ
  return {name: environ[name] for name in VARIABLES if environ.get(name)}
