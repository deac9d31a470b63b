"""The Colab notebooks run top to bottom on the CPU (nbclient, an IPython kernel), as tiny runs:
a changed command, flag, output file or column breaks this test, not a user's notebook.

Each notebook's first code cell (tagged ``parameters``) holds its settings; this test adds a cell
after it (as papermill does) with ``SMOKE = True`` and tiny sizes. ``SMOKE`` skips what needs
the network or an accelerator (installing, downloading the model and TFDS data, ``heads-jax
doctor``, TensorBoard); every other cell runs as written, ``!heads-jax ...`` commands included.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, SHARED, requires_shared, skip_unless_ci

NOTEBOOKS = REPO / "notebooks"


def _execute(name: str, params: str, cwd: Path, timeout: int = 600):
  try:
    import nbclient
    import nbformat
  except ImportError:
    skip_unless_ci("nbclient is not installed (pip install -e '.[test]')")
    pytest.skip("nbclient is not installed")
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  first = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", ()))
  nb.cells.insert(first + 1, nbformat.v4.new_code_cell(params, metadata={"tags": ["injected-parameters"]}))
  client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                   resources={"metadata": {"path": str(cwd)}})
  start, cpu = time.perf_counter(), _children_cpu()
  client.execute()
  seconds = time.perf_counter() - start
  print(f"{name}: {seconds:.0f} s wall, {_children_cpu() - cpu:.0f} CPU-seconds (kernel and its commands)")
  shell_failures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                    if o.get("name") == "stderr" and "error:" in o.get("text", "")]
  return nb, seconds, shell_failures


def _children_cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def _text(nb) -> str:
  return "\n".join(o.get("text", "") if "text" in o else json.dumps(o.get("data", {}))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.fixture
def kernel_path(monkeypatch):
  """The kernel and its `!` commands use this interpreter's tools (heads-jax, python) and the
  run's compilation cache (conftest's HEADS_JAX_CACHE_DIR)."""
  monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


@pytest.mark.slow
@requires_shared("glue", "MRPC")
def test_finetune_and_analyze_notebook_runs(tmp_path, kernel_path):
  from tests.test_cli_errors import _tiny_model_dir
  bert = _tiny_model_dir(tmp_path / "bert")
  work = tmp_path / "runs"
  data = (f"--config.data.source=tsv --config.data.glue_dir={SHARED / 'glue'} "
          "--config.data.max_examples=32 --config.data.max_seq_length=32 "
          "--config.model.dtype=float32 --config.eval_batch_size=16 --config.log_every=1")
  params = (f"SMOKE = True\nWORK = {str(work)!r}\nREPO_DIR = {str(REPO)!r}\nBERT = {str(bert)!r}\n"
            f"TASK, BATCH, LR, STEPS, WARMUP = 'mrpc', 8, 1e-3, 2, 1\n"
            f"EXAMPLES, PRETRAIN_STEPS = 8, 2\nDATA = {data!r}")
  nb, seconds, failures = _execute("colab_finetune_and_analyze.ipynb", params, tmp_path)
  assert not failures, failures
  run = work / "mrpc_bs8_lr0.001"
  assert (run / "best_model").is_dir() and (run / "summary.json").is_file()
  for d in ("analysis_pretrained", "analysis_mrpc"):
    assert (work / d / "tests.csv").is_file() and (work / d / "report.html").is_file()
  assert (work / "compare_mrpc" / "report.html").is_file()
  assert (work / "pretrain_tiny" / "model").is_dir()


@pytest.mark.slow
@requires_shared("glue", "MRPC")
def test_reproduce_notebook_runs(tmp_path, kernel_path):
  work = tmp_path / "reproduce"
  extra = (f"--config.tasks=mrpc --config.data.glue_dir={SHARED / 'glue'} "
           "--config.test_sequences=8")
  params = (f"SMOKE = True\nPRESET = 'toy'\nWORK = {str(work)!r}\nREPO_DIR = {str(REPO)!r}\n"
            f"EXTRA = {extra!r}")
  nb, seconds, failures = _execute("colab_reproduce.ipynb", params, tmp_path)
  assert not failures, failures
  assert (work / "paper_table.csv").is_file() and (work / "report.html").is_file()
  assert "claim" in _text(nb)  # the table cell showed the paper table's columns
