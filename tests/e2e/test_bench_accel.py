"""Smoke test of the accelerator benchmark's command line (bench/bench_pretrain_mfu.py) with a
CPU-sized setting: it runs, prints its table with the device line, writes its JSON, and its FLOP
convention holds. One setting without the breakdown: both attention paths with the forward /
backward / optimizer breakdown run through the same ``run_setting`` in the accelerator suite's
``pretrain`` part (tests/e2e/test_bench_accelerator.py)."""

from __future__ import annotations

import pytest

from tests.e2e.test_bench_smoke import _check_machine, _has_table, _run


@pytest.mark.slow
def test_bench_pretrain_mfu(tmp_path):
  stdout, res = _run("bench_pretrain_mfu.py",
                     ["--size", "tiny", "--seq-lens", "32", "--batch", "32=4", "--predictions",
                      "32=5", "--dtype", "float32", "--steps", "1", "--repeats", "1",
                      "--attention-dropout", "0.0", "--optimizer", "adamw", "--no-breakdown"],
                     tmp_path)
  assert stdout.startswith("device: 1 x cpu")
  _has_table(stdout, "tokens/s", "MFU (6N+12ldq)", "MFU +decoder")
  _check_machine(res["machine"])
  [r] = res["results"]
  # the fused row names its implementation: XLA on the CPU (cuDNN or the flash kernel on a GPU)
  assert r["attention_path"] == "fused: xla" and "breakdown_s" not in r
  assert 5 < r["loss"] < 15 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
  # 6 N + 12 l d q: tiny has l = 2, d = 64
  assert r["flops_per_token"]["palm_6N_12ldq"] == 6 * r["non_embedding_params"] + 12 * 2 * 64 * 32
  assert res["machine"]["git_commit"] and "unknown" not in res["machine"]["git_commit"]
