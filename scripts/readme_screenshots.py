#!/usr/bin/env python
"""Regenerate README's two report screenshots from the current code.

Usage: python scripts/readme_screenshots.py --demo runs/demo [--analysis runs/reference]

* ``docs/report_screenshot.png``: the top of the demo's front page (``DEMO/report.html``; run
  ``heads-jax demo`` first, README's first command);
* ``docs/analysis_report_screenshot.png``: the top of the analysis report of all-MiniLM-L6-v2 on
  the first 200 UD EWT test sentences (the reports' reference setting,
  ``scripts/reference_values.py``), analysed here into ``--analysis`` unless it holds a report.

Needs Chromium (``scripts/screenshot.py``). Each shot is cut at ``--cut`` pixels (the top of the
page: its settings, headline figures and first figures), as README shows them.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from reference_values import COMMAND  # noqa: E402  (the reference setting: one definition)
from screenshot import screenshot  # noqa: E402


def _shot(html: Path, out: Path, width: int, cut: int) -> Path:
  screenshot(html, out, width=width, height=min(cut, 4000), max_height=max(cut, 4000))
  img = Image.open(out)
  if img.height > cut:
    img.crop((0, 0, img.width, cut)).save(out, format="PNG", optimize=True)
  print(f"wrote {out} ({Image.open(out).size[0]} x {Image.open(out).size[1]})")
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--demo", default=str(REPO / "runs" / "demo"), help="a finished demo's folder")
  ap.add_argument("--analysis", default=str(REPO / "runs" / "reference"),
                  help="the reference analysis's folder (analysed here when it has no report)")
  ap.add_argument("--cut", type=int, default=4200, help="height of each screenshot in pixels")
  args = ap.parse_args(argv)
  front = Path(args.demo) / "report.html"
  if not front.is_file():
    print(f"{front} does not exist: run `heads-jax demo --out {args.demo}` first", file=sys.stderr)
    return 2
  analysis = Path(args.analysis)
  if not (analysis / "report.html").is_file():
    cmd = shlex.split(COMMAND) + ["--out", str(analysis)]
    print("running:", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
      return 2
  _shot(front, REPO / "docs" / "report_screenshot.png", 1000, min(args.cut, 1900))
  _shot(analysis / "report.html", REPO / "docs" / "analysis_report_screenshot.png", 900, args.cut)
  return 0


if __name__ == "__main__":
  sys.exit(main())
