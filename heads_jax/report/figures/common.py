"""What the figure modules share: creating and saving a figure, finite values, notes, heatmaps.

matplotlib's object API only (``Figure``, no pyplot state); no jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from matplotlib import ticker as mticker
from matplotlib.figure import Figure

from heads_jax import storage

DEFAULT_DPI = 110

# tick labels as plain numbers (1, 3, 10) on log axes
PLAIN = mticker.FuncFormatter(lambda v, _pos: f"{v:g}")


def new_figure(width: float, height: float, constrained: bool = True) -> Figure:
  """A figure of ``width`` x ``height`` inches (constrained layout unless told otherwise)."""
  return Figure(figsize=(width, height), layout="constrained" if constrained else None)


def save_figure(fig: Figure, path, dpi: int) -> Path:
  """Writes ``fig`` as a PNG at ``path`` (must end in .png; folders are created) and, always, as
  an SVG beside it (same name, ``.svg``: vector text and lines for papers; fonts as paths, so it
  looks the same everywhere). Returns the PNG's path (the report embeds the PNG).

  The SVG reuses the layout the PNG's save computed: with a layout engine (constrained layout)
  every ``savefig`` lays the figure out and draws it twice (matplotlib's pre-draw, then the
  drawing), so the engine is set aside for the second file. A third of the time of saving both
  (``plot_role_heatmaps``: 1.4 against 2.0 CPU-s); the PNG is the same file, byte for byte."""
  path = Path(path)
  if path.suffix.lower() != ".png":
    raise ValueError(f"figure path must end in .png, got {str(path)!r}")
  path.parent.mkdir(parents=True, exist_ok=True)
  engine = fig.get_layout_engine()
  with storage.naming(path):  # a full disk names the figure, not a bare [Errno 28]
    fig.savefig(path, dpi=dpi, format="png", facecolor="white")
    if engine is not None:
      fig.set_layout_engine("none")   # the positions stay where the PNG's layout put them
    try:
      fig.savefig(path.with_suffix(".svg"), format="svg", facecolor="white",
                  metadata={"Date": None})  # no timestamp: the same figure gives the same file
    finally:
      if engine is not None:
        fig.set_layout_engine(engine)
  return path


def finite(values) -> np.ndarray:
  """float64 ``[m]``: the finite entries of ``values`` (any shape), flattened."""
  v = np.asarray(values, dtype=np.float64).ravel()
  return v[np.isfinite(v)]


def empty_note(ax, text: str):
  """A grey note in the middle of an empty panel."""
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11,
          color="#555555")
  ax.set_xticks([])
  ax.set_yticks([])


def heatmap(ax, values, *, cmap="viridis", fmt="{:.2f}", vmin=None, vmax=None, label=""):
  """A layer x head heatmap of ``values`` ``[l, h]`` with a colour bar; cells are labelled
  with their value when there are at most 400."""
  values = np.asarray(values, float)
  im = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
  L, H = values.shape
  ax.set_xticks(np.arange(H))
  ax.set_yticks(np.arange(L))
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  if L * H <= 400:
    lo, hi = np.nanmin(values), np.nanmax(values)
    mid = (lo + hi) / 2
    for i in range(L):
      for j in range(H):
        v = values[i, j]
        if np.isfinite(v):
          ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6.5,
                  color="white" if (cmap == "viridis" and v < mid) else "black")
  cb = ax.figure.colorbar(im, ax=ax, shrink=0.85)
  cb.set_label(label)
  return im
