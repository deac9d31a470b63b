"""The accelerator suite's part ``analysis_ab`` (bench/analysis_ab.py, issue 38 item 6) with its
tiny CPU settings: every path has its row (or says "absent"), each analysis path agrees with the
stand-alone statistics and the float32 reference on the batch with arcs, the statistics-alone
and profile rows come out (the Pallas ones "absent" on the CPU), and the long-sequence rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_bench_smoke import bench_env

REPO = Path(__file__).resolve().parents[2]
PATHS = ("bare forward", "forward returning maps", "stacked v1 (stand-alone functions)",
         "stacked v2 (layerwise.reduce_stack)", "stacked (the step's)", "layerwise", "fused",
         "kernel")


@pytest.mark.slow
def test_analysis_ab_runs_every_path_on_the_cpu(tmp_path):
  out = tmp_path / "acc"
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "accelerator.py"), "--tiny",
                         "--parts", "analysis_ab", "--out", str(out)], capture_output=True,
                        text=True, env=bench_env(), cwd=REPO, timeout=1500)
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
  # what was measured and where: the commit and the device, in the part and in the file
  where = rows["measured on"]
  assert where["value"] == "1 x cpu" and where["detail"]["commit"] == res["commit"], where
  assert len(res["commit"]) >= 7 and "unknown" not in res["commit"]
  # as a user runs it (issue 50 item 7): UD EWT and MRPC packed as the device pass packs them,
  # the bare forward, stacked and the kernel side by side, beside the full-row batch
  for label in ("UD EWT test, packed, gold arcs", "MRPC dev pairs, packed, no parser"):
    pad = rows[f"data: {label}: padding of the packed batches"]
    assert 0 <= pad["value"] < 0.5 and pad["detail"]["sequences"] == 6, pad
    assert pad["detail"]["shapes"] == {"2 x 32": pad["detail"]["positions"] // 64}, pad
    for path in ("bare forward", "stacked", "kernel"):
      r = rows[f"data: {label}: {path}, per batch (2 x 32)"]
      assert r["unit"] == "ms/step" and r["value"] > 0 and float(r["ratio"]) > 0, r
    check = rows[f"check data: {label}: kernel against stacked"]
    assert check["value"] < 1e-4 and check["ratio"] == "NaN pattern equal", check
  for label in ("full rows, batch 8 x 32 with arcs", "UD EWT test, packed, gold arcs",
                "MRPC dev pairs, packed, no parser"):
    d = rows[f"side by side, {label}"]["detail"]
    assert set(d["ms_per_step"]) == {"bare forward", "stacked", "kernel"}, d
    assert all(v > 0 for v in d["ms_per_step"].values()), d
    for path in ("stacked", "kernel"):
      assert abs(d["ratio_to_bare_forward"][path]
                 - d["ms_per_step"][path] / d["ms_per_step"]["bare forward"]) < 1e-9, d
    assert d["fastest"] in ("stacked", "kernel") and d["auto"] == ["layerwise"], d   # a CPU
    assert d["auto_follows_measurement"] is False, d


def test_the_data_rows_run_the_batches_of_analyze():
  """``analysis_ab.data_batches`` (written without heads_jax.pipelines, which the device may not
  import) gives the device pass's packed batches of ``heads-jax analyze``: its sort window and
  ``pass_packing`` (short rows for single sentences, full rows for pairs)."""
  import dataclasses

  import numpy as np

  sys.path.insert(0, str(REPO / "bench"))
  import analysis_ab
  from heads_jax.data.specs import encode_spec
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.pipelines.analysis import AnalysisConfig
  from heads_jax.pipelines.device_pass import pass_packing
  defaults = {f.name: f.default for f in dataclasses.fields(AnalysisConfig)}
  assert analysis_ab.SORT_WINDOW == defaults["sort_window"]
  for spec, syntax, shapes in (("ud-ewt", True, {(64, 64), (8, 128)}),
                               ("mrpc", False, {(8, 128)})):
    got = analysis_ab.data_batches(spec, syntax, 128, 32, 300)
    _, batches, _ = encode_spec(spec, load_tokenizer(), max_length=128, batch_size=32,
                                max_examples=300, syntax=syntax, pad_to_batch_size=True,
                                sort_window=defaults["sort_window"])
    want = list(pass_packing(batches, length=128, rows=32, window=defaults["sort_window"]))
    assert len(got) == len(want) and {b["input_ids"].shape for _, b in got} <= shapes | {(32, 128)}
    for (gi, gb), (wi, wb) in zip(got, want):
      np.testing.assert_array_equal(gi, wi)
      assert gb.keys() == wb.keys() and "segment_ids" in gb
      for f in gb:
        np.testing.assert_array_equal(gb[f], wb[f])
    summary = analysis_ab.packing_summary(got)
    assert summary["sequences"] == 300 and 0 < summary["padding_share"] < 0.2, summary
