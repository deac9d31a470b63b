"""Figures stay legible from a toy model (2 layers x 4 heads) to BERT-large (24 x 16): every
text of a figure (labels, tick labels, legend, titles) lies inside the saved figure, where
matplotlib's own tight bounding box would show a clipped label."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from heads_jax.data import vocabulary
from heads_jax.report.figures import pande
from tests.report.test_report import make_scores, make_tests_df

SHAPES = {"toy": (2, 4), "bert_large": (24, 16)}


@pytest.fixture
def captured(monkeypatch):
  """The figures the drawing functions save (not written to disk)."""
  figs = []

  def keep(fig, path, dpi):
    figs.append(fig)
    return path
  monkeypatch.setattr(pande, "save_figure", keep)
  return figs


def clipped_texts(fig) -> list[str]:
  """The drawn texts of ``fig`` that reach outside it: empty when matplotlib's tight bounding box
  of everything drawn lies inside the figure (1/50 inch of slack)."""
  FigureCanvasAgg(fig)
  renderer = fig.canvas.get_renderer()
  fig.draw(renderer)
  tight, (w, h), eps = fig.get_tightbbox(renderer), fig.get_size_inches(), 0.02
  if tight.x0 >= -eps and tight.y0 >= -eps and tight.x1 <= w + eps and tight.y1 <= h + eps:
    return []
  box, out = fig.bbox, []
  for t in fig.findobj(Text):
    if not t.get_visible() or not t.get_text().strip() or (t.axes is not None and not t.axes.axison
                                                          and t in t.axes.get_xticklabels() + t.axes.get_yticklabels()):
      continue
    e = t.get_window_extent(renderer)
    if e.x0 < box.x0 - 2 or e.y0 < box.y0 - 2 or e.x1 > box.x1 + 2 or e.y1 > box.y1 + 2:
      out.append(t.get_text())
  return out or [f"tight bbox {tight.bounds} outside {w:.2f} x {h:.2f} in"]


def _tests(layers, heads):
  scores = make_scores(n=12, layers=layers, heads=heads)
  return make_tests_df(scores["sieve_bias"], vocabulary.ROLES)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("figure", ["role_grid", "role_venn", "score_cdf"])
def test_no_text_is_clipped(shape, figure, captured, tmp_path):
  layers, heads = SHAPES[shape]
  tests = _tests(layers, heads)
  if figure == "role_grid":
    pande.plot_role_grid(tests, tmp_path / "f.png", dpi=40)
  elif figure == "role_venn":
    pande.plot_role_venn(tests, tmp_path / "f.png", dpi=40)
  else:
    scores = make_scores(n=12, layers=layers, heads=heads)["sieve_bias"]
    pande.plot_score_cdf(scores, tmp_path / "f.png", tau=3.0, dpi=40)
  assert captured, "nothing drawn"
  assert clipped_texts(captured[-1]) == []


def _overlapping(texts, renderer) -> list[tuple[str, str]]:
  boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts
           if t.get_visible() and t.get_text().strip()]
  return [(a, b) for i, (a, ea) in enumerate(boxes) for b, eb in boxes[i + 1:] if ea.overlaps(eb)]


@pytest.mark.parametrize("low, high", [(0.5, 4.0), (0.08, 9.0), (1e-4, 60.0)])
def test_cdf_tick_labels_do_not_overlap(low, high, captured, tmp_path):
  """Narrow ranges used to label minor ticks of the log axis (0.6 0.7 0.8 ... on top of each
  other)."""
  scores = np.geomspace(low, high, 500)
  pande.plot_score_cdf(scores, tmp_path / "f.png", tau=3.0, dpi=40)
  fig = captured[-1]
  FigureCanvasAgg(fig)
  renderer = fig.canvas.get_renderer()
  fig.draw(renderer)
  ax = fig.axes[0]
  labels = [t for t in ax.get_xticklabels(which="both")
            if low * 0.5 <= float(t.get_position()[0]) <= high * 1.5 * 1.3]
  assert len([t for t in labels if t.get_text()]) >= 2
  assert _overlapping(labels, renderer) == []


def test_venn_names_an_empty_set_instead_of_drawing_it(captured, tmp_path):
  """Three roles tested, one held by no head: its name no longer lands on another's."""
  flags = pd.DataFrame({"local": [True, True, False, False], "delimiter": [True, False, True, False],
                        "block": [False] * 4})
  pande.plot_role_venn(flags, tmp_path / "f.png", sets=("local", "delimiter", "block"), dpi=40)
  fig = captured[-1]
  FigureCanvasAgg(fig)
  renderer = fig.canvas.get_renderer()
  fig.draw(renderer)
  texts = fig.axes[0].texts + [fig._supxlabel]
  assert any("no head has block (not drawn)" in t.get_text() for t in texts)
  assert not any(t.get_text() == "block" for t in texts)
  assert _overlapping(texts, renderer) == []
