"""bench/pretrain_ab.py (issue 39 item 6): the variants' order and what an absent switch does, and
the part run through bench/accelerator.py with --tiny: every variant measured with a finite loss
close to the baseline's, the profiled variants' profiles (categories and phases summing to the
span), the breakdown for the baseline and the fastest default."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import pretrain_ab  # noqa: E402


def test_variants_in_order_and_absent_switches(monkeypatch):
  monkeypatch.delenv(pretrain_ab.VARIANTS_ENV, raising=False)
  assert [v.name for v, _ in pretrain_ab.variants(long=True)] == ["V0", "V6", "V16", "V17", "V19",
                                                                  "V20", "V18", "V5", "V8"]
  monkeypatch.setenv(pretrain_ab.VARIANTS_ENV, "V0,V1,V4,V6,V16,V17,V19,V20,V9,V10,V11,V12,V13,"
                     "V14,V7,V18,V15,V5")
  chosen = {v.name: v for v, _ in pretrain_ab.variants()}
  assert list(chosen) == ["V0", "V1", "V4", "V6", "V16", "V17", "V19", "V20", "V9", "V10", "V11",
                          "V12", "V13", "V14", "V7", "V18", "V15", "V5"]
  # issue 49: V16 is V6 with the custom gradients (every other variant traces fused_ops.plain())
  v16 = chosen["V16"]
  issue49 = ("V16", "V17", "V19", "V20", "V18", "V5")
  assert v16.fused_ops and not any(v.fused_ops for n, v in chosen.items() if n not in issue49)
  assert dataclasses.replace(v16, fused_ops=False, name="V6", label=chosen["V6"].label) == chosen["V6"]
  # V17: the flash kernels at Tuning's defaults (8 warps, from the offline sm_90 compile)
  v17 = chosen["V17"]
  assert v17.flash == () and dataclasses.replace(v17, flash=v16.flash, name="V16",
                                                 label=v16.label) == v16
  # V19: + the fused block ends; V20: + 8-bit masks (configs/pretrain.py's step), V18 its twice
  v19, v20 = chosen["V19"], chosen["V20"]
  assert not v17.fused_norm and v19.fused_norm and v20.dropout_bits == 8
  assert dataclasses.replace(v19, fused_norm=False, name="V17", label=v17.label) == v17
  assert dataclasses.replace(v20, dropout_bits=32, name="V19", label=v19.label) == v19
  assert dataclasses.replace(chosen["V18"], batch_factor=1, name="V20", label=v20.label) == v20
  v0, v1, v4, v5, v6, v7 = (chosen[n] for n in ("V0", "V1", "V4", "V5", "V6", "V7"))
  # V9-V11 are V6 with compile options or the flash kernels' launch settings
  for n in ("V9", "V10", "V11", "V12", "V13", "V14"):
    assert dataclasses.replace(chosen[n], name="V6", label=v6.label, xla=(), flash=v6.flash) == v6
  assert dict(chosen["V9"].xla) == {"xla_gpu_enable_cublaslt": True}
  assert dict(v6.flash) == {"fwd_warps": 4, "bwd_warps": 4}     # issue 39's launch settings
  assert dict(chosen["V10"].flash) == {"fwd_warps": 4, "inner": 64, "bwd_warps": 8}
  assert dict(chosen["V14"].xla) == {"xla_gpu_enable_cublaslt": True,
                                     "xla_gpu_enable_cudnn_layer_norm": True}
  assert dict(chosen["V14"].flash) == {"fwd_warps": 4, "bwd_warps": 4, "fuse_dq": True}
  assert dataclasses.replace(chosen["V15"], batch_factor=1, name="V14",
                             label=chosen["V14"].label) == chosen["V14"]
  assert (v0.attention_dropout, v1.attention_dropout, v4.attention_dropout) == (0.1, 0.0, 0.1)
  assert (v4.attention, v4.dropout_rng, v4.layer_norm_dtype) == ("flash", "rbg", "compute")
  # the flat LAMB is a side row on V20; the padded logits and the batch build on V4
  assert v5.flat_lamb and dataclasses.replace(v5, flat_lamb=False, name="V20", label=v20.label) == v20
  assert not v6.flat_lamb and v6.mlm_logits == "padded" and v6.attention == "flash"
  assert v7.batch_factor == 2 and dataclasses.replace(v7, batch_factor=1, name="V6",
                                                      label=v6.label) == v6
  monkeypatch.delenv(pretrain_ab.VARIANTS_ENV)
  v8 = {v.name: v for v, _ in pretrain_ab.variants(long=True)}["V8"]
  assert v8.long and dataclasses.replace(v8, long=False, name="V20", label=v20.label) == v20
  assert v8.shape({"long": (64, 512, 80)}) == (64, 512, 80)
  assert v7.shape({"batch": 256, "seq": 128, "preds": 20}) == (512, 128, 20)
  monkeypatch.setenv(pretrain_ab.VARIANTS_ENV, "V7, V6")
  assert [v.name for v, _ in pretrain_ab.variants()] == ["V6", "V7"]     # their own order
  monkeypatch.setenv(pretrain_ab.VARIANTS_ENV, "V6,V99")
  with pytest.raises(SystemExit, match="no variant V99"):
    pretrain_ab.variants()
  monkeypatch.delenv(pretrain_ab.VARIANTS_ENV)
  monkeypatch.setenv(pretrain_ab.LONG_ENV, "64,512,80")
  assert pretrain_ab.settings(tiny=False)["long"] == (64, 512, 80)
  monkeypatch.setenv(pretrain_ab.LONG_ENV, "64,512")
  with pytest.raises(SystemExit, match="batch,sequence,predictions"):
    pretrain_ab.settings(tiny=False)
  monkeypatch.setenv(pretrain_ab.LONG_ENV, "none")
  assert pretrain_ab.settings(tiny=False)["long"] is None
  monkeypatch.delenv(pretrain_ab.LONG_ENV)
  assert pretrain_ab.settings(tiny=False)["long"] == (64, 512, 80)    # phase 2 by default
  assert pretrain_ab._peer_shapes(pretrain_ab.settings(tiny=False)) == [(256, 128, 20),
                                                                         (64, 512, 80)]
  monkeypatch.setattr(pretrain_ab, "_has_flash", lambda: False)
  monkeypatch.setattr(pretrain_ab, "_has_config_field", lambda name: False)
  monkeypatch.setenv(pretrain_ab.VARIANTS_ENV, "V4")
  v4 = {v.name: v for v, _ in pretrain_ab.variants()}["V4"]
  assert v4.attention == "explicit" and v4.layer_norm_dtype == "float32"
  assert "no flash kernel" in v4.label and "layer_norm_dtype" in v4.label


@pytest.mark.slow
def test_the_part_runs_tiny_through_the_suite(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device
  env["XLA_FLAGS"] = pretrain_ab.TINY_XLA_FLAGS    # no LLVM optimisations: it checks, not times
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  # the baseline, configs/pretrain.py's step (every issue-49 form and the 8-bit masks) and the
  # flat LAMB; no long sequence (one torch peer): the part runs, records its figures, profiles
  # and breakdowns (the other variants differ in settings the first test checks)
  env[pretrain_ab.VARIANTS_ENV] = "V0,V20,V5"
  env[pretrain_ab.LONG_ENV] = "none"
  out = tmp_path / "acc"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--tiny",
                         "--parts", "pretrain_ab", "--out", str(out)], capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=1500)
  assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  part, = json.loads((out / "accelerator.json").read_text())["parts"]
  assert part["name"] == "pretrain_ab" and part["status"] == "done", part["status"]
  rows = part["rows"]
  measured = [r for r in rows if r["unit"] == "tokens/s" and not r["what"].startswith("torch")]
  assert [r["what"].split()[0] for r in measured] == ["V0", "V20", "V5"]
  assert measured[1]["detail"]["loss_after_steps"] != measured[0]["detail"]["loss_after_steps"]
  # torch's peer in the same call, beside the fastest variant of its shape
  peers = [r for r in rows if r["what"].startswith("torch peer")]
  assert [r["what"] for r in peers] == ["torch peer (eager), seq 32 batch 4"], peers
  assert all(r["value"] > 0 and "heads_jax V" in r["ratio"] for r in peers)
  assert part["rows"] and json.loads((out / "accelerator.json").read_text())["machine"]["git_commit"]
  base = measured[0]["detail"]["loss_after_steps"]
  for r in measured:
    d = r["detail"]
    assert r["value"] > 0 and d["finite"] and abs(d["loss_after_steps"] - base) < 0.1, r
  # each profiled variant's row follows its figure: categories and phases sum to the span
  profiles = [r for r in rows if " profile" in r["what"]]
  assert [r["what"].split()[0] for r in profiles] == ["V0", "V20", "V5"]
  for r in profiles:
    prof = r["detail"]["profile"]
    assert sum(prof["categories"].values()) == pytest.approx(prof["span_ms"], rel=1e-6)
    assert sum(prof["phases"].values()) == pytest.approx(prof["span_ms"], rel=1e-6)
    assert prof["categories"]["GEMM"] > 0 and prof["phases"]["optimizer"] > 0
    assert prof["phases"]["forward"] > 0 and prof["phases"]["backward"] > 0
  v5 = next(r for r in profiles if r["what"].startswith("V5"))["detail"]["profile"]
  assert v5["categories"]["optimizer"] > 0
  # the breakdowns come after every variant's figure: the baseline's and the fastest default's
  breakdowns = [r for r in rows if "breakdown:" in r["what"]]
  assert [r["what"][:3] for r in breakdowns] == ["V0 ", "V20"]
  assert rows.index(breakdowns[0]) > rows.index(measured[-1])
  for r in breakdowns:
    b = r["detail"]["breakdown_ms"]
    assert b["forward"] > 0 and b["optimizer_alone"] > 0
  assert "pretrain_ab" in (out / "accelerator.md").read_text()
