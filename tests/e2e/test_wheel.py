"""The package installs anywhere: a wheel built from this checkout, installed into a fresh virtual
environment, runs the README's commands from an unrelated directory (configs ship inside it);
the quick demo's files and lines are checked there (``test_demo.check_quick_demo``), and a rerun
reuses its analysis.

The virtual environment sees this machine's site-packages (``--system-site-packages``) so that
the dependencies are found without a download (``pip install --no-index`` fails rather than
fetch anything); the heads_jax it runs is the wheel's, which the test checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest

from tests.helpers import REPO, minilm_dir
from tests.pipelines.test_demo import check_quick_demo


def _run(cmd, cwd, env=None, timeout=600):
  r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_from_anywhere(tmp_path):
  dist = tmp_path / "dist"
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
        str(REPO)], cwd=tmp_path)
  wheel, = dist.glob("heads_jax-*.whl")
  env_dir = tmp_path / "venv"
  venv.create(env_dir, system_site_packages=True, with_pip=True)
  py = env_dir / "bin" / "python"
  _run([str(py), "-m", "pip", "install", "-q", "--no-index", str(wheel)], cwd=tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  env.update(PYTHONNOUSERSITE="1")   # HEADS_JAX_CACHE_DIR: the run's cache (conftest)
  where = _run([str(py), "-c", "import heads_jax, heads_jax.configs, heads_jax.train, heads_jax.analyze; "
                "print(heads_jax.__file__); print(heads_jax.configs.__file__)"], cwd=elsewhere, env=env)
  assert all(str(env_dir) in line for line in where.split()), where  # the wheel's copy, not the checkout
  cli = str(env_dir / "bin" / "heads-jax")
  out = _run([cli, "pretrain", "--config", "configs/pretrain.py:tiny", "--workdir", "runs/pt_tiny",
              "--config.num_train_steps=3", "--config.log_every=1", "--config.eval_every=0",
              "--config.export=False"], cwd=elsewhere, env=env)
  assert "done: step 3" in out
  if minilm_dir() is not None:
    out = _run([cli, "demo", "--quick", "--out", "runs/demo"], cwd=elsewhere, env=env)
    assert (elsewhere / "runs" / "demo" / "report.html").is_file(), out
    check_quick_demo(elsewhere / "runs" / "demo", out.splitlines())
    # run again, it reuses the analysis
    out = _run([cli, "demo", "--quick", "--out", "runs/demo"], cwd=elsewhere, env=env)
    assert "reusing" in out, out
