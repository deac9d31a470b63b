"""``heads-jax doctor`` on the CPU: what the quick doctor prints (``check_quick_doctor_lines``,
applied to the accelerator suite's doctor part), its flags through ``cli.main``, and exit 1 on a
planted mismatch."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from heads_jax import cli, doctor


def check_quick_doctor_lines(lines: list[str], *, devices: int, xla_flags: str) -> None:
  """What ``heads-jax doctor --quick`` prints on the CPU (``devices`` emulated, ``xla_flags`` in
  the environment): the environment lines, every path within tolerance of the float32
  reference, the two timings, and the verdict. The quick doctor's run is the accelerator suite's
  doctor part (tests/e2e/test_bench_accelerator.py checks its lines with this), not a second
  run here: the same ``run_doctor(quick=True)`` is over a minute on 2 cores."""
  assert lines[0] == "heads-jax doctor"
  assert lines[1].startswith(f"platform: cpu, {devices} x cpu ({devices} local), 1 process(es)")
  assert f"jax {jax.__version__}" in lines[2] and "flax " in lines[2] and "optax " in lines[2]
  assert xla_flags in lines[3]
  checks = {tuple(line.split()[:3]): line for line in lines if line.startswith("  attention ")
            or line.startswith("  analysis ")}
  for impl in ("layerwise", "fused", "stacked"):
    for dtype in ("float32", "bfloat16"):
      assert checks[("analysis", impl, dtype)].rstrip().split()[5] == "ok", checks
  for path in ("explicit", "xla"):
    for dtype in ("float32", "bfloat16"):
      line = checks[("attention", path, dtype)]
      assert line.split()[5] == "ok" and float(line.split()[3]) < 5e-3 * (
          12 if dtype == "bfloat16" else 1)
  assert "skipped: cuDNN: GPUs only" in checks[("attention", "cudnn", "bfloat16")]
  # the float32 paths agree with the reference to float32 rounding on the CPU
  assert float(checks[("analysis", "layerwise", "float32")].split()[3]) < 1e-5
  timed = [line for line in lines if "tokens/s" in line]
  assert len(timed) == 2 and "analysis step (layerwise)" in timed[0]
  assert "pre-training step (LAMB)" in timed[1] and all("MFU n/a" in t for t in timed)
  assert lines[-1] == "all checks passed"


def test_doctor_flags_reach_run_doctor(monkeypatch):
  seen = []
  monkeypatch.setattr(doctor, "run_doctor", lambda **kw: seen.append(kw) or {"ok": kw["quick"]})
  assert cli.main(["doctor", "--quick", "--steps", "1"]) == 0
  assert cli.main(["doctor", "--no-timing", "--steps", "0"]) == 1     # "ok": False -> exit 1
  assert seen == [{"quick": True, "timing": True, "steps_": 1},
                  {"quick": False, "timing": False, "steps_": 1}]


@pytest.mark.slow
def test_doctor_exits_1_on_a_mismatch(capsys, monkeypatch):
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **k: real(*a, **k) * 1.1)
  monkeypatch.setattr(doctor, "analysis_checks", lambda *a: [])  # the attention checks only
  code = cli.main(["doctor", "--no-timing"])
  out = capsys.readouterr().out
  assert code == 1
  lines = {tuple(line.split()[:3]): line for line in out.splitlines()
           if line.startswith("  attention ")}
  assert lines[("attention", "explicit", "float32")].split()[5] == "ok"
  assert lines[("attention", "xla", "float32")].split()[5] == "MISMATCH"
  last = out.splitlines()[-1]
  assert last.startswith("MISMATCH in ") and "attention xla (float32)" in last
  assert "explicit" not in last


def test_relative_error_by_hand():
  nan = np.nan
  assert doctor.relative_error([1.0, 10.0, nan], [1.5, 12.0, nan]) == pytest.approx(0.5 / 1.5)
  assert doctor.relative_error([0.2], [0.1]) == pytest.approx(0.1)  # |ref| < 1: absolute
  assert doctor.relative_error([1.0, 2.0], [1.0, nan]) == np.inf     # NaN where ref is not
  assert doctor.relative_error([1.0], [[1.0]]) == np.inf
  check = doctor.Check("x", "float32", 6e-3, 5e-3)
  assert not check.ok and "MISMATCH" in check.line()
  assert doctor.Check("x", "float32", None, 5e-3, "did not compile").ok is False
  assert doctor.Check("x", "bfloat16", None, 6e-2, "GPUs only", skipped=True).ok


@pytest.mark.parametrize("name,value,line", [
    ("HEADS_JAX_STORAGE_TIMEOUT", "abc", "environment: HEADS_JAX_STORAGE_TIMEOUT must be a "
                                         "positive number of seconds (e.g. 300), got 'abc'"),
    ("HEADS_JAX_STATS_IMPL", "bogus", "environment: HEADS_JAX_STATS_IMPL must be one of "
                                      "layerwise, fused, stacked, kernel (or empty), got 'bogus'"),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_no_such_flag=1",
     "environment: XLA_FLAGS holds a flag this XLA does not know: --xla_no_such_flag=1 (XLA would "
     "end every job on it); remove it from XLA_FLAGS"),
])
def test_doctor_names_a_bad_variable_and_exits_1_before_jax(capsys, monkeypatch, name, value, line):
  monkeypatch.setenv(name, value)
  monkeypatch.setattr(doctor, "environment", lambda: pytest.fail("JAX was asked for devices"))
  code = cli.main(["doctor", "--no-timing"])
  out = capsys.readouterr().out.splitlines()
  assert code == 1
  assert out == ["heads-jax doctor", line,
                 "environment: 1 variable(s) set to values every job would stop on; fix them and "
                 "run heads-jax doctor again"]


def test_doctor_fails_on_a_path_variable_that_does_not_exist(capsys, monkeypatch, tmp_path):
  monkeypatch.setenv("HEADS_JAX_SQUAD_FILE", str(tmp_path / "none.json"))
  monkeypatch.setattr(doctor, "attention_checks", lambda *a: [])
  monkeypatch.setattr(doctor, "analysis_checks", lambda *a: [])
  code = cli.main(["doctor", "--no-timing"])
  out = capsys.readouterr().out.splitlines()
  assert code == 1
  assert out[1] == (f"environment: HEADS_JAX_SQUAD_FILE={tmp_path / 'none.json'}: no such file; "
                    f"point it at one or unset it")
  assert out[-1] == "all checks passed, but 1 variable(s) name paths that do not exist (above)"


def test_timings_halve_a_batch_that_does_not_fit(monkeypatch):
  tried = []

  def fake(*, quick, steps_, per_device_batch):
    tried.append(per_device_batch)
    if per_device_batch > 8:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB")
    return [{"batch": per_device_batch}]

  monkeypatch.setattr(doctor, "_timings", fake)
  monkeypatch.setattr(doctor.jax, "default_backend", lambda: "gpu")
  n = jax.device_count()
  assert doctor.timings() == [{"batch": 8}]
  assert tried[0] == -(-doctor.ACCELERATOR_BATCH // n) and tried[-1] == 8
  assert tried == sorted(tried, reverse=True) and all(a // 2 == b for a, b in zip(tried, tried[1:]))
  monkeypatch.setattr(doctor, "_timings", lambda **k: (_ for _ in ()).throw(ValueError("a bug")))
  with pytest.raises(ValueError, match="a bug"):  # anything else is not retried
    doctor.timings()
