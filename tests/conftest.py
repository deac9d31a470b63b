"""Test setup: 8 emulated CPU devices (set before jax is imported), no downloads, and an XLA
compilation cache per xdist worker."""
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["XLA_FLAGS"] += "" if "device_count" in os.environ["XLA_FLAGS"] else " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# One persistent XLA compilation cache per xdist worker, shared with every `heads-jax` command the
# worker's tests start: a tiny program one test compiled is loaded, not compiled again, by the
# next (a compilation still counts in `stats.compiling.CompileLog`). Not one folder for both
# workers: JAX writes an entry in place, unlocked, so a process could read one half written (a
# warning on stderr), and its lock (a size limit) re-reads the whole folder at every write. The
# cache is `heads-jax`'s own (`cli.enable_compilation_cache`); `HEADS_JAX_CACHE_DIR` set before
# pytest (a folder, or `off`) is used as it is.
_MADE_CACHE = None
if "HEADS_JAX_CACHE_DIR" not in os.environ:   # the controller (or a run without xdist)
  _MADE_CACHE = os.environ["HEADS_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="heads_jax_tests_xla_")
_WORKER, _CACHE = os.environ.get("PYTEST_XDIST_WORKER"), os.environ["HEADS_JAX_CACHE_DIR"]
if _WORKER and _CACHE.lower() not in ("off", "0", "none", "") and os.path.basename(_CACHE) != _WORKER:
  os.environ["HEADS_JAX_CACHE_DIR"] = os.path.join(_CACHE, _WORKER)

from heads_jax.cli import enable_compilation_cache  # noqa: E402  (after the environment above)

enable_compilation_cache()


def pytest_unconfigure(config):
  if _MADE_CACHE is not None:   # the process that made the folder (the controller) removes it
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)
