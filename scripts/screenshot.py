#!/usr/bin/env python
"""Full-page PNG screenshot of a local HTML file with headless Chromium.

Usage: python scripts/screenshot.py report.html [--out report.png] [--width 1400]

Chromium's ``--screenshot`` captures only the window, so the page is shot in a tall window,
the window is made taller until the bottom of the shot is empty background, and the empty
rows below the content are cut off. Needs a Chromium binary (Debian: ``apt-get install
chromium``); nothing is fetched from the network (the flags switch off every background
connection and the profile is a fresh temporary directory).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(explicit: str | None = None) -> str:
  """Path of a Chromium / Chrome binary, or a clear error."""
  if explicit:
    if not Path(explicit).exists() and not shutil.which(explicit):
      raise FileNotFoundError(f"Chromium binary {explicit!r} not found")
    return explicit
  for name in CANDIDATES:
    found = shutil.which(name)
    if found:
      return found
  raise FileNotFoundError("no Chromium found (tried " + ", ".join(CANDIDATES) + "); install it, "
                          "e.g. `apt-get install -y chromium`, or pass --chromium PATH")


def _shoot(chromium: str, url: str, out: Path, width: int, height: int, timeout: float):
  with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-extensions", "--disable-default-apps",
           "--hide-scrollbars", "--force-device-scale-factor=1", "--virtual-time-budget=3000",
           f"--user-data-dir={profile}", f"--screenshot={out}", f"--window-size={width},{height}",
           url]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  if result.returncode != 0 or not out.is_file():
    raise RuntimeError(f"Chromium failed (exit {result.returncode}):\n{result.stderr[-2000:]}")


def _content_bottom(img: np.ndarray) -> int:
  """Index one past the last row that differs from the page background (the bottom-left pixel)."""
  background = img[-1, 0].astype(int)
  differs = (np.abs(img.astype(int) - background).max(-1) > 8).any(-1)  # [rows]
  rows = np.flatnonzero(differs)
  return int(rows[-1]) + 1 if rows.size else 0


def screenshot(html_path, out_path, *, width: int = 1400, height: int = 4000,
               max_height: int = 40000, margin: int = 40, chromium: str | None = None,
               timeout: float = 120.0) -> Path:
  """Write a full-page screenshot of ``html_path`` to ``out_path`` (PNG); returns the path."""
  html_path = Path(html_path).resolve()
  if not html_path.is_file():
    raise FileNotFoundError(f"{html_path} does not exist")
  out_path = Path(out_path)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  chromium = find_chromium(chromium)
  url = html_path.as_uri()
  with tempfile.TemporaryDirectory(prefix="screenshot-") as tmp:
    shot = Path(tmp) / "shot.png"
    while True:
      _shoot(chromium, url, shot, width, height, timeout)
      img = np.asarray(Image.open(shot).convert("RGB"))
      bottom = _content_bottom(img)
      if bottom < img.shape[0] - margin or height >= max_height:
        break
      height = min(max_height, height * 2)  # content reaches the bottom: a taller window
    keep = min(img.shape[0], max(bottom + margin, 1))
    Image.fromarray(img[:keep]).save(out_path, format="PNG", optimize=True)
  return out_path


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("html", help="the HTML file to shoot")
  parser.add_argument("--out", help="PNG to write (default: next to the HTML, .png)")
  parser.add_argument("--width", type=int, default=1400, help="window width in pixels")
  parser.add_argument("--height", type=int, default=4000, help="first window height to try")
  parser.add_argument("--max-height", type=int, default=40000, help="tallest window to try")
  parser.add_argument("--chromium", help="Chromium binary (default: found on PATH)")
  args = parser.parse_args(argv)
  out = args.out or str(Path(args.html).with_suffix(".png"))
  try:
    path = screenshot(args.html, out, width=args.width, height=args.height,
                      max_height=args.max_height, chromium=args.chromium)
  except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as e:
    print(f"screenshot failed: {e}", file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
