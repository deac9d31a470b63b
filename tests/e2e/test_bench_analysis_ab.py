"""The accelerator suite's part ``analysis_ab`` (bench/analysis_ab.py, issue 38 item 6) with its
tiny CPU settings: every path has its row (or says "absent"), each analysis path agrees with the
stand-alone statistics and the float32 reference on the batch with arcs, the statistics-alone
and profile rows come out (the Pallas ones "absent" on the CPU), and the long-sequence rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATHS = ("bare forward", "forward returning maps", "stacked v1 (stand-alone functions)",
         "stacked v2 (layerwise.reduce_stack)", "stacked (the step's)", "layerwise", "fused",
         "kernel")


def test_analysis_ab_runs_every_path_on_the_cpu(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  out = tmp_path / "acc"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--tiny",
                         "--parts", "analysis_ab", "--out", str(out)], capture_output=True,
                        text=True, env=env, cwd=REPO, timeout=1500)
  assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  res = json.loads((out / "accelerator.json").read_text())
  [part] = res["parts"]
  assert part["name"] == "analysis_ab" and part["status"] == "done", part["status"]
  rows = {r["what"]: r for r in part["rows"]}
  timed = {name: r for name, r in rows.items() if r["unit"] == "ms/step" and "8 x 32" in name}
  for path in PATHS:
    hits = [r for name, r in timed.items() if name.startswith(path + ",")]
    assert hits or rows.get(path, {}).get("value") == "absent", path
    for r in hits:
      assert r["value"] > 0 and float(r["ratio"]) > 0, r
  assert float(timed["bare forward, batch 8 x 32 float32 with arcs"]["ratio"]) == 1.0
  checks = [r for name, r in rows.items() if name.startswith("check ")]
  assert {c["what"] for c in checks} >= {"check layerwise against stacked v1",
                                         "check kernel against stacked v1"}
  for c in checks:   # float32 on the CPU: every path is the definitions to float32 rounding
    assert c["value"] < 1e-4 and c["ratio"] == "NaN pattern equal", c
  assert "check kernel against the float32 reference" in rows
  verdict = rows["precision verdict (kernel vs stacked, against float32)"]["value"]
  assert "within 1e-4 of float32" in verdict, verdict          # float32 model: nothing to tell
  alone = [r for name, r in timed.items() if name.startswith("statistics alone: XLA wrapper")]
  assert len(alone) == 1 and alone[0]["value"] > 0, alone
  assert rows["statistics kernel alone: the Pallas call, every layer"]["value"] == "absent"
  profile = {name: r["value"] for name, r in rows.items() if name.startswith("profile of kernel")}
  assert profile and all(v == "absent" or v >= 0 for v in profile.values()), profile
  long = [r for name, r in rows.items() if "one sequence of" in name]
  assert [r["what"].split(",")[0] for r in long] == ["bare forward", "kernel"]
  assert long[1]["detail"]["note"] == "finite distance: True"
  assert long[1]["detail"]["temp_bytes"] > 0 and long[1]["detail"]["map_bytes"] > 0
  assert "analysis_ab" in (out / "accelerator.md").read_text()
