"""Figures of heads_jax.report.figures.robustness: each draws a PNG and an SVG from small tables,
and the registered draw functions skip what the inputs lack."""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.report.figures import robustness as fig
from heads_jax.report.spec import Inputs


def _sinks():
  L, H = 3, 2
  layer, head = np.indices((L, H)).reshape(2, -1)
  return pd.DataFrame({"layer": layer, "head": head, "first_attention": np.linspace(0, 0.6, 6),
                       "sep1_attention": 0.2, "sep2_attention": [np.nan, 0.1] * 3,
                       "norm_ratio": np.linspace(0.1, 1, 6), "sink": np.linspace(0, 0.6, 6) > 0.3})


def test_each_figure_writes_png_and_svg(tmp_path):
  by = {"attention": {"local": 0.2, "delimiter": 0.8}, "norm": {"local": 0.25, "delimiter": 0.05}}
  best = pd.DataFrame([{"relation": "nsubj", "direction": "dep2head", "n": 120, "layer": 3, "head": 1,
                        "accuracy": 0.6, "low": 0.5, "high": 0.7, "baseline_offset": 1,
                        "baseline_accuracy": 0.4, "baseline_low": 0.3, "baseline_high": 0.5,
                        "beats_baseline": True}])
  causal = pd.DataFrame([{"group": "delimiter", "num_heads": 5, "change": -0.1, "metric": "accuracy",
                          "ablation": "remove", "random_mean_change": -0.02,
                          "random_std_change": 0.01, "p_value": 0.01}])
  traj = pd.DataFrame({"step": [50, 100], "share_local": [0.1, 0.2], "bias_local": [1.5, 2.0],
                       "bias_cls": [2.0, 5.0], "sink_rate": [0.0, 0.3]})
  paths = [fig.plot_weighting_roles(by, tmp_path / "w.png"),
           fig.plot_sinks(_sinks(), tmp_path / "s.png"),
           fig.plot_parsing(best, tmp_path / "p.png"),
           fig.plot_causal(causal, {"delimiter": [-0.03, -0.01, 0.0]}, tmp_path / "c.png"),
           fig.plot_causal(causal, None, tmp_path / "c2.png"),
           fig.plot_trajectory(traj, tmp_path / "t.png")]
  for p in paths:
    assert p.stat().st_size > 1000 and p.with_suffix(".svg").is_file()


def test_registered_draws_skip_missing_inputs(tmp_path):
  for f in fig.FIGURES:
    assert f.draw(Inputs(), tmp_path / f"{f.name}.png", title=f.title, dpi=60) is None
  inputs = Inputs(summary={"by_weighting": {"attention": {"local": 0.5}, "norm": {"local": 0.0}},
                           "sink_threshold": 0.3}, sinks=_sinks())
  assert fig.FIGURES["robustness_weighting"].draw(inputs, tmp_path / "a.png", title="t", dpi=60)
  assert fig.FIGURES["robustness_sinks"].draw(inputs, tmp_path / "b.png", title="t", dpi=60)


def test_trajectory_gives_each_of_the_13_roles_its_own_colour(tmp_path, monkeypatch):
  from matplotlib import colors

  from heads_jax.data.vocabulary import ROLES
  kept = []
  monkeypatch.setattr(fig, "save_figure", lambda f, path, dpi: kept.append(f) or path)
  traj = pd.DataFrame({"step": [50, 100], "sink_rate": [0.0, 0.3],
                       **{f"bias_{r}": [1.0 + i, 2.0 + i] for i, r in enumerate(ROLES)}})
  fig.plot_trajectory(traj, tmp_path / "t.png")
  lines = [line for line in kept[0].axes[1].get_lines() if line.get_label() in ROLES]
  assert len(lines) == len(ROLES) == 13
  assert len({colors.to_hex(line.get_color()) for line in lines}) == 13
