#!/usr/bin/env python
"""PNG of the analysis report's head view with one head open (the README picture).

Usage: python scripts/head_view_screenshot.py OUT_DIR/report.html --head 1:4 [--example 0]
       [--mode lines|heatmap] [--hover 3] [--out docs/head_view_screenshot.png]

Opens the report in headless Chromium (tests/browser.py: DevTools protocol, nothing fetched),
clicks the head in the role grid with real mouse events, picks the example and the mode, hovers
a query token if asked, and shoots the head-view section. Needs a Chromium binary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.browser import Browser, find_chromium  # noqa: E402  (the repository's own helper)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("html")
  p.add_argument("--head", required=True, help="LAYER:HEAD")
  p.add_argument("--example", type=int, default=0, help="which example (0-based)")
  p.add_argument("--mode", choices=("lines", "heatmap"), default="lines")
  p.add_argument("--hover", type=int, default=None, help="hover this query position (lines mode)")
  p.add_argument("--out", default="docs/head_view_screenshot.png")
  args = p.parse_args(argv)
  chromium = find_chromium()
  if chromium is None:
    print("no Chromium found; install it (e.g. apt-get install chromium)", file=sys.stderr)
    return 1
  with Browser(chromium, width=1400, height=1200) as b:
    b.open(args.html)
    b.click(f'.hv-grid [data-head="{args.head}"]')
    if args.example:
      b.click(f"#hv-controls button:nth-of-type({args.example + 1})")
    if args.mode == "heatmap":
      b.click("#hv-controls button:last-of-type")
    if args.hover is not None:
      b.hover(f'#hv-view text[data-i="{args.hover}"]')
    problems = b.problems()
    if problems:
      print("page problems:\n" + "\n".join(problems), file=sys.stderr)
      return 1
    print(b.screenshot(args.out, selector="#hv"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
