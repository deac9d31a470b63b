"""heads_jax/xla_flags.py: merging never overrides the user's entries, platform detection,
and every default flag name is known to the installed jaxlib (an unknown one aborts XLA)."""

import os
import subprocess
import sys

from heads_jax import xla_flags


def test_merge_keeps_user_entries_and_order():
  user = "--xla_force_host_platform_device_count=8 --xla_gpu_enable_latency_hiding_scheduler=false"
  out = xla_flags.merge(user, xla_flags.GPU_FLAGS)
  assert out.startswith(user)
  parsed = xla_flags.parse(out)
  assert parsed["xla_gpu_enable_latency_hiding_scheduler"] == "false"   # the user's value
  assert parsed["xla_gpu_all_reduce_combine_threshold_bytes"] == "134217728"
  assert parsed["xla_force_host_platform_device_count"] == "8"
  assert out.count("latency_hiding") == 1
  assert xla_flags.merge("", {}) == ""


def test_apply_and_platform_detection(monkeypatch):
  monkeypatch.setattr(xla_flags, "backend_initialised", lambda: False)
  env = {"JAX_PLATFORMS": "cuda", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert xla_flags.detect_platform(env) == "gpu"
  out = xla_flags.apply(environ=env)
  assert env["XLA_FLAGS"] == out and out.startswith("--xla_dump_to=/tmp/x ")
  assert set(xla_flags.GPU_FLAGS) <= set(xla_flags.parse(out))
  assert xla_flags.apply(environ=env) == out                    # idempotent
  env = {"JAX_PLATFORMS": "cpu"}
  assert xla_flags.apply(environ=env) == "" and "XLA_FLAGS" not in env
  env = {"JAX_PLATFORMS": "cuda", "HEADS_JAX_XLA_FLAGS": "off"}
  assert xla_flags.apply(environ=env) == "" and "XLA_FLAGS" not in env


def test_apply_refuses_after_jax_started(monkeypatch, capsys):
  monkeypatch.setattr(xla_flags, "backend_initialised", lambda: True)
  env = {"JAX_PLATFORMS": "cuda"}
  assert xla_flags.apply(environ=env) == "" and "XLA_FLAGS" not in env
  assert "already initialised" in capsys.readouterr().err


def test_default_flag_names_are_known_to_this_jaxlib():
  flags = " ".join(f"--{k}={v}" for table in xla_flags.DEFAULTS.values() for k, v in table.items())
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.numpy.ones(2).sum())"],
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "2.0" in proc.stdout, proc.stderr[-2000:]


def test_unknown_names_the_flags_this_xla_does_not_know():
  assert xla_flags.unknown("") == ()
  assert xla_flags.unknown("--xla_force_host_platform_device_count=8") == ()
  assert xla_flags.unknown("--xla_force_host_platform_device_count=8 --xla_not_a_flag=1 "
                           "--xla_gpu_enable_latency_hiding_scheduler=true --xla_nor_this") == (
      "--xla_not_a_flag=1", "--xla_nor_this")


def test_a_job_refuses_an_unknown_flag_with_one_line(monkeypatch):
  from heads_jax.errors import UserError
  monkeypatch.setattr(xla_flags, "backend_initialised", lambda: False)
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_not_a_flag=1"}
  import pytest
  with pytest.raises(UserError) as e:
    xla_flags.require_known(environ)
  assert str(e.value) == ("environment: XLA_FLAGS holds a flag this XLA does not know: "
                          "--xla_not_a_flag=1 (XLA would end every job on it); remove it from "
                          "XLA_FLAGS")
  xla_flags.require_known({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  monkeypatch.setattr(xla_flags, "backend_initialised", lambda: True)  # XLA took them already
  xla_flags.require_known(environ)
