"""Two host processes on this machine (4 CPU devices each, a localhost coordinator, gloo
collectives; tests/multihost_worker.py) against one process with 8 devices (this one):
pre-training stops at step 4, both processes are started again and resume, and the losses
equal the 1-process run's; both write one checkpoint directory; fine-tuning from it and the
analysis of its model give the 1-process losses and scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from heads_jax import contract
from heads_jax.pipelines.analyze import run_analysis
from heads_jax.training import configlib, finetune, pretrain
from tests.gcs_emulator import free_port
from tests.helpers import REPO
from tests.multihost_worker import (analysis_config, finetune_overrides,
                                    tiny_pretrain_overrides)

WORKER = REPO / "tests" / "multihost_worker.py"
NUM_PROCESSES = 2


def _launch(phase: str, root) -> list[dict]:
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.setdefault("HEADS_JAX_CACHE_DIR", "off")
  procs = [subprocess.Popen([sys.executable, str(WORKER), phase, str(i), str(NUM_PROCESSES),
                             str(port), str(root)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
           for i in range(NUM_PROCESSES)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=600)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, p in enumerate(procs):
    assert p.returncode == 0, f"process {i} of phase {phase} failed:\n{outputs[i][-4000:]}"
  return [json.loads((root / f"{phase}_{i}.json").read_text()) for i in range(NUM_PROCESSES)]


@pytest.mark.slow
def test_two_processes_equal_one_process_and_resume_together(tmp_path):
  root = tmp_path / "mp"
  root.mkdir()
  first = _launch("first", root)
  assert [r["pretrain"]["final_step"] for r in first] == [4, 4]
  kept = sorted(p.name for p in (root / "pt" / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == ["2", "4"]  # one directory, written by both processes together
  second = _launch("second", root)
  for r in second:
    assert r["process_count"] == 2 and r["device_count"] == 8
    assert r["pretrain"]["start_step"] == 4 and r["pretrain"]["origin"].endswith("@4")
  assert sorted(p.name for p in (root / "pt" / "checkpoints").iterdir()
                if p.name.isdigit()) == ["4", "6"]

  # the same runs in this process: 1 process, 8 devices
  ref_pt = pretrain.train_and_evaluate(
      configlib.load_config("configs/pretrain.py:tiny", tiny_pretrain_overrides(export=False)),
      tmp_path / "pt1")
  ref = [h["loss"] for h in ref_pt["history"]]
  for r1, r2 in zip(first, second):
    got = [h["loss"] for h in r1["pretrain"]["history"] + r2["pretrain"]["history"]]
    np.testing.assert_allclose(got, ref, rtol=1e-5)
  rows = [json.loads(x) for x in (root / "pt" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # process 0 alone writes

  ref_ft = finetune.train_and_evaluate(
      configlib.load_config("configs/finetune.py:tiny_sst2",
                            finetune_overrides(str(root / "pt" / "checkpoints"))),
      tmp_path / "ft1")
  for r in second:
    np.testing.assert_allclose([h["loss"] for h in r["finetune"]["history"]],
                               [h["loss"] for h in ref_ft["history"]], rtol=1e-5)
    assert r["finetune"]["final_eval"]["accuracy"] == pytest.approx(
        ref_ft["final_eval"]["accuracy"])
  assert (root / "ft" / "best_model").is_dir()

  assert [r["analysis"]["process_index"] for r in second] == [0, 1]
  ref_heads = run_analysis(analysis_config(root / "pt" / "model", tmp_path / "heads1"),
                           progress=False, log=lambda *a: None)
  got, want = contract.read_scores(root / "heads"), contract.read_scores(ref_heads["out"])
  assert got.sieve_bias.shape == want.sieve_bias.shape and got.num_sequences == 12
  np.testing.assert_allclose(got.sieve_bias, want.sieve_bias, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.distance, want.distance, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  assert (root / "heads" / contract.TESTS_CSV).is_file()
