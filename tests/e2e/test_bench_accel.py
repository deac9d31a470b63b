"""Smoke test of the accelerator benchmark (bench/bench_pretrain_mfu.py) with CPU-sized settings:
it runs, prints its table with the device line, and its FLOP convention and breakdown hold."""

from __future__ import annotations

import pytest

from tests.e2e.test_bench_smoke import _check_machine, _has_table, _run


@pytest.mark.slow
def test_bench_pretrain_mfu(tmp_path):
  stdout, res = _run("bench_pretrain_mfu.py",
                     ["--size", "tiny", "--seq-lens", "32", "--batch", "32=4", "--predictions",
                      "32=5", "--dtype", "float32", "--steps", "1", "--repeats", "1",
                      "--attention-dropout", "0.1,0.0", "--optimizer", "adamw"], tmp_path)
  assert stdout.startswith("device: 1 x cpu")
  _has_table(stdout, "tokens/s", "MFU (6N+12ldq)", "opt alone ms")
  _check_machine(res["machine"])
  explicit, fused = res["results"]
  # the fused row names its implementation: XLA on the CPU (cuDNN or the flash kernel on a GPU)
  assert (explicit["attention_path"], fused["attention_path"]) == ("explicit", "fused: xla")
  for r in res["results"]:
    assert 5 < r["loss"] < 15 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
    # 6 N + 12 l d q: tiny has l = 2, d = 64
    assert r["flops_per_token"]["palm_6N_12ldq"] == 6 * r["non_embedding_params"] + 12 * 2 * 64 * 32
    b = r["breakdown_s"]
    assert b["forward"] > 0 and b["optimizer_alone"] > 0
