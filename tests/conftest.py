"""Test setup: 8 emulated CPU devices (set before jax is imported), no downloads, and one XLA
compilation cache for the whole run."""
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

# One persistent XLA compilation cache for the run, shared by both xdist workers (they inherit this
# environment from the controller) and by every `heads-jax` command a test starts: a tiny program
# one test compiled is loaded, not compiled again, by the next (a compilation still counts in
# `stats.compiling.CompileLog`). The cache is `heads-jax`'s own (`cli.enable_compilation_cache`);
# `HEADS_JAX_CACHE_DIR` set before pytest (a folder, or `off`) is used as it is.
_MADE_CACHE = None
if "HEADS_JAX_CACHE_DIR" not in os.environ:
  _MADE_CACHE = os.environ["HEADS_JAX_CACHE_DIR"] = tempfile.mkdtemp(prefix="heads_jax_tests_xla_")

from heads_jax.cli import enable_compilation_cache  # noqa: E402  (after the environment above)

enable_compilation_cache()


def pytest_unconfigure(config):
  if _MADE_CACHE is not None:   # the process that made the folder (the controller) removes it
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)
