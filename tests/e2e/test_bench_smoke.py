"""Smoke tests of the benchmark scripts (bench/): each runs with its smallest settings, prints a
table and writes JSON whose numbers are checked (agreement between the compared
implementations, finite losses, machine description). Also checks the notebook-style loop
baseline against the independent loop reference of tests/reference_impl.py.

The scripts run in subprocesses without ``XLA_FLAGS`` (one CPU device, as the benchmarks are
meant to run); the timings themselves are not checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import reference_impl as R

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


# The smoke runs check that each script runs and what it writes, not its speed: XLA:CPU compiles
# without LLVM's optimisations (about half the compile time of these tiny programs; what every
# smoke spends most of its time on).
SMOKE_XLA_FLAGS = "--xla_backend_optimization_level=0"


def bench_env() -> dict:
  """The environment of a bench script's smoke run: one CPU device (no ``XLA_FLAGS`` of the
  tests' 8-device emulation), ``SMOKE_XLA_FLAGS``, the checkout on ``PYTHONPATH``."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["XLA_FLAGS"] = SMOKE_XLA_FLAGS
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  return env


def _run(script: str, args: list, tmp_path: Path) -> tuple[str, dict]:
  out = tmp_path / f"{Path(script).stem}.json"
  env = bench_env()
  proc = subprocess.run([sys.executable, str(BENCH / script), *args, "--out", str(out)],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
  assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
  assert out.is_file(), f"{script} wrote no JSON"
  return proc.stdout, json.loads(out.read_text())


def _has_table(stdout: str, *columns: str) -> None:
  lines = [ln for ln in stdout.splitlines() if ln.startswith("|")]
  assert len(lines) >= 3, f"no table printed:\n{stdout}"
  header = " ".join(lines)
  for c in columns:
    assert c in header, f"column {c!r} missing from the tables:\n{stdout}"


def _check_machine(machine: dict) -> None:
  assert machine["date_utc"][:2] == "20"
  assert machine["versions"]["jax"] and machine["versions"]["torch"]
  assert machine["cpu"]["cores"] >= 1
  assert machine["xla_flags"] == SMOKE_XLA_FLAGS     # one device: no emulation flag


def test_notebook_loops_match_reference():
  """The baseline's per-token loops give the reference implementation's scores."""
  import bench.bench_notebook_baseline as nb
  rng = np.random.default_rng(3)
  batch = R.random_batch(rng, 4, 12)
  attn = R.random_attention(rng, batch["attention_mask"], 2, 3, junk=False)
  roles = ("local", "prev_local", "next_local", "block", "block_plain", "cls", "sep", "delimiter",
           "nsubj", "obj", "amod", "advmod", "syntactic")
  want_sb = R.sieve_bias(attn, batch, roles)
  want_d = R.distance_features(attn, batch)
  for i in range(4):
    row = R.row_of(batch, i)
    got = nb.notebook_sieve_bias(attn[i], row, roles)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want_sb[i]))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want_sb[i]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nb.notebook_distance(attn[i], row), want_d[i], rtol=1e-5, atol=1e-6)


def test_common_table_and_summary():
  import bench.common as common
  s = common.summarize([3.0, 1.0, 2.0], [1.5, 0.5, 1.0])
  assert (s["median_s"], s["min_s"], s["max_s"], s["cpu_median_s"]) == (2.0, 1.0, 3.0, 1.0)
  assert common.rate(10, s) == 5.0
  table = common.format_table([{"a": 1, "b": 2.5}, {"a": 10, "b": None}]).splitlines()
  assert table[0] == "|  a |   b |" and table[2] == "|  1 | 2.5 |" and table[3] == "| 10 |     |"
  peak = common.cpu_peak_flops_estimate({"avx2": True, "fma": True, "cores": 2, "mhz": 1000.0})
  assert peak["flops"] == 2 * 1000e6 * 32


@pytest.mark.slow
def test_bench_notebook_baseline(tmp_path):
  """The script's command line, table and JSON. Its scores against heads_jax's (``--check``) are
  checked where heads_jax's step runs anyway: the accelerator suite's ``notebook`` part and
  ``test_bench_analysis``'s baseline (the loops against the reference: above)."""
  stdout, res = _run("bench_notebook_baseline.py",
                     ["--random", "--size", "tiny", "--sequences", "6", "--batch-size", "4",
                      "--max-length", "32", "--threads", "1"], tmp_path)
  _has_table(stdout, "seq_per_s", "maps_s", "loops_s")
  r = res["result"]
  assert r["sequences"] == 6 and r["seq_per_s"] > 0 and r["torch_threads"] == 1, r
  # 6 sequences' stored maps [l, h, k, k] float32 (tiny: 2 x 4 heads, at most 32 positions)
  assert 0 <= r["maps_mib"] <= round(6 * 2 * 4 * 32 * 32 * 4 / 2**20, 1), r
  assert res["agreement_with_heads_jax"] is None
  assert res["machine"]["git_commit"] and "unknown" not in res["machine"]["git_commit"]


@pytest.mark.slow
def test_bench_analysis(tmp_path):
  stdout, res = _run("bench_analysis.py",
                     ["--random", "--size", "tiny", "--sequences", "8", "--batch-size", "4",
                      "--max-length", "32", "--repeats", "1", "--baseline-sequences", "4",
                      "--baseline-threads", "1", "--memory-sequences", "4",
                      "--memory-multiples", "1,2", "--compare-impls", ""], tmp_path)
  _has_table(stdout, "seq_per_s", "heads_jax_speedup", "analysis_peak_rss_mib")
  _check_machine(res["machine"])
  tp = res["throughput"]
  assert tp["sequences"] == 8 and tp["layers"] == 2 and tp["heads"] == 4
  assert all(r["seq_per_s"] > 0 for r in tp["rows"])
  bl = res["notebook_baseline"]
  assert bl["sequences"] == 4
  for key in ("sieve_bias", "distance"):
    agree = bl["agreement_with_heads_jax"][key]
    assert agree["nan_pattern_equal"] and agree["max_abs_diff"] < 1e-3, agree
  assert [m["sequences"] for m in res["memory"]] == [4, 8]
  for m in res["memory"]:   # sieve_bias [N, 2, 4, 13] + distance [N, 2, 4, 21] float32 + 2 x int32 [N]
    n = m["sequences"]
    assert m["result_arrays_bytes"] == n * 2 * 4 * (13 + 21) * 4 + 2 * n * 4
    assert m["notebook_stored_maps_mib"] == round(n * 2 * 4 * 32 * 32 * 4 / 2**20, 1)


@pytest.mark.slow
def test_bench_forward(tmp_path):
  stdout, res = _run("bench_forward.py",
                     ["--size", "tiny", "--batch-size", "2", "--seq-len", "16", "--repeats", "1",
                      "--torch-threads", "1"], tmp_path)
  _has_table(stdout, "tokens_per_s", "GFLOP/s")
  _check_machine(res["machine"])
  assert res["attention_max_abs_diff"] < 1e-4
  assert len(res["methods"]) == 4 and all(m["tokens_per_s"] > 0 for m in res["methods"].values())
  # tiny: 2 layers x (4 d^2 + 2 d f + biases + 2 LayerNorms) + pooler, d = 64, f = 128
  d, f = 64, 128
  layer = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d
  assert res["non_embedding_params"] == 2 * layer + d * d + d


@pytest.mark.slow
def test_bench_training(tmp_path):
  stdout, res = _run("bench_training.py",
                     ["--sizes", "tiny", "--batch", "tiny=4", "--seq-len", "32",
                      "--max-predictions", "5", "--steps", "1", "--repeats", "1",
                      "--optimizers", "adamw", "--torch-threads", "1"], tmp_path)
  _has_table(stdout, "tokens_per_s", "MFU")
  _check_machine(res["machine"])
  tiny = res["sizes"]["tiny"]
  assert set(tiny["methods"]) == {"heads_jax adamw", "torch AdamW masked-only, 1 thr",
                                  "torch AdamW full (HF labels API), 1 thr"}
  for m in tiny["methods"].values():
    assert 5 < m["loss"] < 15, m["loss"]            # ~ ln(30522) + ln(2) at initialisation
    assert m["tokens_per_s"] > 0
  fpt = tiny["flops_per_token"]
  assert fpt["palm_6N_12ldq"] == 6 * tiny["non_embedding_params"] + 12 * 2 * 64 * 32
