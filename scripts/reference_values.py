#!/usr/bin/env python
"""Regenerate the reports' reference column: heads_jax's own headline figures on all-MiniLM-L6-v2
over the first 200 UD EWT test sentences (gold arcs), written to
``heads_jax/report/assets/reference.json``, which `heads_jax.report.headline` reads.

Usage: python scripts/reference_values.py [--out-dir runs/reference]

Runs ``heads-jax analyze`` (COMMAND below; about a CPU-minute) and copies the summary's headline
figures. Rerun it whenever a change moves the figures; tests/report/test_reference.py checks that
README quotes the file's values.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "heads_jax" / "report" / "assets" / "reference.json"
COMMAND = ("heads-jax analyze --model all-MiniLM-L6-v2 --data ud-ewt --max-examples 200 "
           "--parser none")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out-dir", default=str(REPO / "runs" / "reference"))
  args = ap.parse_args(argv)
  sys.path.insert(0, str(REPO))
  from heads_jax.report import headline
  cmd = shlex.split(COMMAND) + ["--out", args.out_dir, "--no-report", "--examples", "0",
                                "--overwrite"]
  print("running:", " ".join(cmd), flush=True)
  done = subprocess.run(cmd)
  if done.returncode != 0:
    print(f"the analysis failed (exit {done.returncode}); {TARGET} is unchanged", file=sys.stderr)
    return done.returncode
  summary = json.loads((Path(args.out_dir) / "summary.json").read_text())
  figures = {row.key: headline.lookup(summary, row.key) for row in headline.ROWS}
  doc = {"setting": "all-MiniLM-L6-v2, the first 200 UD EWT test sentences (gold arcs)",
         "command": COMMAND, "date": datetime.date.today().isoformat(), "figures": figures,
         "not_computed": summary.get("not_computed") or {}}
  TARGET.write_text(json.dumps(doc, indent=1) + "\n")
  headline.reference.cache_clear()
  print(f"wrote {TARGET}")
  for row in headline.ROWS:
    print(f"  {row.short}: {headline.reference_value(row)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
