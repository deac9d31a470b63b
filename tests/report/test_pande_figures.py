"""Pande et al. figures added for issue 23: the four-set Venn, Fig. 2, the tau sweep."""

import numpy as np
import pytest
import pandas as pd

from heads_jax.hoststats import summary
from heads_jax.report.figures import pande


def test_venn4_regions_are_the_fifteen_intersections():
  centres = pande.venn4_centres(200)
  assert len(centres) == 15
  for combo, (x, y) in centres.items():   # each label sits inside exactly its ellipses
    assert tuple(bool(pande.venn4_inside(x, y, k)) for k in range(4)) == combo


def test_four_set_venn_and_the_new_figures_draw(tmp_path):
  rng = np.random.default_rng(0)
  flags = pd.DataFrame(rng.random((24, 4)) < 0.5, columns=["local", "syntactic", "block", "delimiter"])
  assert pande.plot_role_venn(flags, tmp_path / "venn.png").is_file()
  assert pande.plot_role_venn(flags, tmp_path / "venn3.png", sets=("local", "block", "delimiter")).is_file()
  x = rng.lognormal(0.0, 1.0, size=(30, 2, 2, 4))
  roles = ("local", "syntactic", "delimiter", "block")
  ex = summary.skewed_example(x, roles, 3.0)
  assert pande.plot_score_distribution(ex, tmp_path / "fig2.png", tau=3.0).is_file()
  assert pande.plot_tau_sweep(summary.tau_sweep(x, roles), tmp_path / "sweep.png", tau=3.0).is_file()
  assert {"score_distribution", "tau_sweep"} <= {f.name for f in pande.FIGURES}


def test_guan_fig5_takes_the_sequence_most_heads_hold(tmp_path):
  import base64
  from heads_jax.report.figures import guan

  def enc(m):
    return base64.b64encode(np.round(255 * m).astype(np.uint8).tobytes()).decode()
  eye, flat = np.eye(3), np.full((3, 3), 1 / 3)
  doc = {"quantization": 255,
         "sequences": [{"index": 7, "tokens": ["a", "b"], "segments": [0, 0]},
                       {"index": 9, "tokens": ["[CLS]", "x", "[SEP]"], "segments": [0, 0, 0]}],
         "heads": [{"layer": 0, "head": 0, "examples": [{"sequence": 1, "map": enc(eye)}]},
                   {"layer": 0, "head": 1, "examples": [{"sequence": 1, "map": enc(flat)}]},
                   {"layer": 1, "head": 0, "examples": [{"sequence": 0, "map": enc(np.eye(2))}]},
                   {"layer": 1, "head": 1, "examples": []}]}
  seq, maps = guan.shared_sequence_maps(doc)
  assert seq == 1 and set(maps) == {(0, 0), (0, 1)}
  np.testing.assert_allclose(maps[(0, 0)], eye, atol=1 / 255)
  clusters = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                           "cluster_name": ["diagonal", "dense", "vertical", "dense"]})
  assert guan.plot_all_maps(doc, clusters, tmp_path / "fig5.png").is_file()
  assert guan.plot_all_maps({"heads": []}, None, tmp_path / "none.png") is None
  # one colour scale for every panel: the uniform head (1/3 everywhere) is not drawn at full black
  import matplotlib.axes
  scales = []
  real = matplotlib.axes.Axes.imshow

  def spy(self, *args, **kw):
    scales.append((kw.get("vmin"), kw.get("vmax")))
    return real(self, *args, **kw)

  matplotlib.axes.Axes.imshow = spy
  try:
    guan.plot_all_maps(doc, clusters, tmp_path / "fig5b.png")
  finally:
    matplotlib.axes.Axes.imshow = real
  assert len(scales) == 2 and len(set(scales)) == 1 and scales[0][1] == pytest.approx(1.0)
  assert guan.FIGURES["group_ablation"].reproduces == "Table 2"


def test_guan_types_per_layer_counts_heads_in_whole_numbers(tmp_path):
  """Guan Fig. 4's y axis counts heads: integer ticks only (a 2-head layer gave 0.25 steps)."""
  import matplotlib.axes
  from heads_jax.report.figures import guan
  df = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0],
                     "cluster_name": ["dense", "diagonal", "dense"]})
  seen = []
  real = matplotlib.axes.Axes.set_ylabel

  def spy(self, *args, **kw):
    seen.append(self)
    return real(self, *args, **kw)

  matplotlib.axes.Axes.set_ylabel = spy
  try:
    guan.plot_cluster_layers(df, tmp_path / "fig4.png")
  finally:
    matplotlib.axes.Axes.set_ylabel = real
  ticks = seen[-1].get_yticks()
  assert len(ticks) >= 2 and np.all(ticks == np.round(ticks))
