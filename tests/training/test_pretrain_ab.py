"""bench/pretrain_ab.py (issue 39 item 6): the variants' order and what an absent switch does, and
the part run through bench/accelerator.py with --tiny: every present variant measured with a
finite loss close to the baseline's, the breakdown for the first and the last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import pretrain_ab  # noqa: E402


def test_variants_in_order_and_absent_switches(monkeypatch):
  names = [v.name for v, _ in pretrain_ab.variants()]
  assert names == ["V0", "V1", "V2", "V3", "V4", "V5", "V6", "V7"]
  monkeypatch.setattr(pretrain_ab, "_has_flash", lambda: False)
  monkeypatch.setattr(pretrain_ab, "_has_config_field", lambda name: False)
  chosen = dict((v.name, (v, absent)) for v, absent in pretrain_ab.variants())
  assert chosen["V2"][1] and chosen["V4"][1]              # absent, with the reason
  v3, v5, v7 = chosen["V3"][0], chosen["V5"][0], chosen["V7"][0]
  assert v3.attention == "explicit" and v3.dropout_rng == "rbg" and "on V0" in v3.label
  assert v5.flat_lamb and v5.layer_norm_dtype == "float32" and v5.dropout_rng == "rbg"
  assert v7.batch_factor == 2 and v7.mlm_logits == "padded" and v7.flat_lamb
  v0, v1 = chosen["V0"][0], chosen["V1"][0]
  assert (v0.attention_dropout, v1.attention_dropout) == (0.1, 0.0)


def test_the_part_runs_tiny_through_the_suite(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  out = tmp_path / "acc"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--tiny",
                         "--parts", "pretrain_ab", "--out", str(out)], capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=1500)
  assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  part, = json.loads((out / "accelerator.json").read_text())["parts"]
  assert part["name"] == "pretrain_ab" and part["status"] == "done", part["status"]
  rows = part["rows"]
  measured = [r for r in rows if r["unit"] == "tokens/s"]
  absent = [r for r in rows if r["value"] == "absent"]
  assert len(measured) + len(absent) == 8 and measured[-1]["what"].startswith("V7")
  assert [r["what"][:2] for r in measured[:2]] == ["V0", "V1"] and measured[-1]["what"][:2] == "V7"
  base = measured[0]["detail"]["loss_after_steps"]
  for r in measured:
    d = r["detail"]
    assert r["value"] > 0 and d["finite"] and abs(d["loss_after_steps"] - base) < 0.1, r
  # the breakdowns come after every variant's figure: the first's and the last's
  breakdowns = [r for r in rows if "breakdown:" in r["what"]]
  assert [r["what"][:2] for r in breakdowns] == ["V0", "V7"]
  assert rows.index(breakdowns[0]) > rows.index(measured[-1])
  for r in breakdowns:
    b = r["detail"]["breakdown_ms"]
    assert b["forward"] > 0 and b["optimizer_alone"] > 0
  for r in absent:
    assert r["detail"]["why"]
  assert "pretrain_ab" in (out / "accelerator.md").read_text()
