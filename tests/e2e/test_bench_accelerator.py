"""The accelerator suite (bench/accelerator.py) with its tiny CPU settings: every part runs and
writes its rows, the JSON and the Markdown table come out, and a part cut by its time limit keeps
the suite going and says so (issue 35: "a cut run keeps what it measured")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_bench_smoke import SMOKE_XLA_FLAGS, bench_env
from tests.test_doctor import check_quick_doctor_lines

REPO = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path, *args: str, timeout: int = 3000):
  out = tmp_path / "acc"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--tiny",
                         "--out", str(out), *args], capture_output=True, text=True,
                        env=bench_env(), cwd=REPO, timeout=timeout)
  assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  return proc.stdout, json.loads((out / "accelerator.json").read_text()), \
      (out / "accelerator.md").read_text()


SIX = ("doctor", "pretrain", "torch_peer", "analysis_step", "analyze", "notebook")


@pytest.mark.slow   # six parts, each in its own process (several minutes on 2 shared cores)
def test_accelerator_suite_runs_every_part_on_the_cpu(tmp_path):
  """The suite's first six parts (analysis_ab and pretrain_ab have tests of their own:
  tests/e2e/test_bench_analysis_ab.py, tests/training/test_pretrain_ab.py). Each part's
  computation runs here only: the pre-training part is bench_pretrain_mfu's ``run_setting``
  (tests/e2e/test_bench_accel.py runs that script's command line on one setting), the notebook
  part bench_notebook_baseline's loops against heads_jax (test_bench_smoke runs that script
  without its check)."""
  stdout, res, md = _suite(tmp_path, "--parts", ",".join(SIX))
  parts = {p["name"]: p for p in res["parts"]}
  assert list(parts) == list(SIX)
  for name, p in parts.items():
    assert p["status"] == "done", (name, p["status"])
    assert p["rows"], name
  rows = {r["what"]: r for p in res["parts"] for r in p["rows"]}
  # the doctor's checks all pass (its printed lines as tests/test_doctor.py expects them: this
  # is the suite's only quick doctor run), and every path of the analysis step has its ratio
  checks = [r for r in parts["doctor"]["rows"] if r["what"].startswith("check ")]
  assert checks and all(r["ratio"] in ("ok", "skipped") for r in checks)
  check_quick_doctor_lines(rows["doctor verdict"]["detail"]["lines"], devices=1,
                           xla_flags=SMOKE_XLA_FLAGS)
  steps = {r["what"]: r for r in parts["analysis_step"]["rows"]}
  for impl in ("layerwise", "fused", "stacked"):
    r = steps[f"analysis step, {impl}"]
    assert r["value"] > 0 and float(r["ratio"]) > 0
  assert steps["auto takes"]["value"] == "layerwise"      # on a CPU
  # pre-training on both attention paths with the breakdown
  pre = parts["pretrain"]["rows"]
  assert [("explicit" in r["what"], "fused" in r["what"]) for r in pre] == [(True, False),
                                                                            (False, True)]
  for r in pre:
    d = r["detail"]
    assert r["value"] > 0 and d["forward_ms"] > 0 and d["optimizer_alone_ms"] > 0
    assert 5 < d["loss"] < 15 and 0 < d["mfu"] < 1, d   # ~ ln(30522) + ln(2) at initialisation
    # 6 N + 12 l d q: tiny has l = 2, d = 64; sequence 32
    assert d["flops_per_token"]["palm_6N_12ldq"] == 6 * d["non_embedding_params"] + 12 * 2 * 64 * 32
  # the fused row names its implementation: XLA on the CPU (cuDNN or the flash kernel on a GPU)
  assert [r["detail"]["attention_path"] for r in pre] == ["explicit", "fused: xla"]
  assert parts["torch_peer"]["rows"][0]["value"] > 0
  e2e = parts["analyze"]["rows"]
  assert len(e2e) == 2 and "cold" in e2e[0]["what"] and "warm" in e2e[1]["what"]
  nb = parts["notebook"]["rows"]
  for key in ("sieve_bias", "distance"):   # the notebook's loops give heads_jax's scores
    agree = nb[0]["detail"]["agreement"][key]
    assert agree["nan_pattern_equal"] and agree["max_abs_diff"] < 1e-3, agree
  assert nb[1]["value"] > 0
  # one Markdown table with a line per row
  for what in rows:
    assert what in md
  assert md.count("\n| ") >= len(rows) + 1


def test_a_part_cut_by_its_limit_is_recorded_and_the_suite_goes_on(tmp_path):
  stdout, res, md = _suite(tmp_path, "--parts", "doctor,torch_peer", "--limits",
                           "doctor=1,torch_peer=1", timeout=600)
  assert [p["name"] for p in res["parts"]] == ["doctor", "torch_peer"]
  for p in res["parts"]:
    assert p["status"] == "cut at its limit of 1 s"
  assert "(cut at its limit of 1 s)" in md


def test_bad_arguments_are_one_line(tmp_path):
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--parts",
                         "nope", "--out", str(tmp_path)], capture_output=True, text=True,
                        cwd=REPO, timeout=300)
  assert proc.returncode == 2 and "unknown part(s) ['nope']" in proc.stderr
  assert "Traceback" not in proc.stderr
