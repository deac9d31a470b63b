"""The ablation figures read accuracy, F1 and exact match in percent (their changes in percentage
points) and the loss as it is (ABLATE's request, issue 43 item 5): the drawn values and the axis
labels, taken from the figure before it is saved."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from heads_jax.report.figures import michel, robustness


@pytest.fixture
def drawn(monkeypatch):
  figs = []
  for module in (michel, robustness):
    monkeypatch.setattr(module, "save_figure", lambda fig, path, dpi: figs.append(fig) or path)
  return figs


def _curve(metric):
  return pd.DataFrame({"method": ["importance", "importance", "random", "random"],
                       "share_pruned": [0.0, 0.5, 0.5, 0.5], "seed": [0, 0, 0, 1],
                       metric: [0.8, 0.6, 0.5, 0.7]})


@pytest.mark.parametrize("metric, scale, label", [("accuracy", 100, "accuracy (%)"),
                                                  ("loss", 1, "loss")])
def test_pruning_curve_in_percent_for_accuracy_not_for_the_loss(drawn, tmp_path, metric, scale, label):
  michel.plot_pruning_curve(_curve(metric), tmp_path / "p.png", metric=metric)
  ax = drawn[-1].axes[0]
  assert ax.get_ylabel() == label
  importance, random = ax.get_lines()[:2]
  np.testing.assert_allclose(importance.get_ydata(), [scale * 0.8, scale * 0.6])
  np.testing.assert_allclose(random.get_ydata(), [scale * 0.6])   # mean of the two seeds


@pytest.mark.parametrize("metric, scale", [("f1", 100), ("loss", 1)])
def test_causal_changes_in_percentage_points_for_f1_not_for_the_loss(drawn, tmp_path, metric, scale):
  causal = pd.DataFrame([{"group": "delimiter", "num_heads": 5, "change": -0.1, "metric": metric,
                          "ablation": "remove", "random_mean_change": -0.02,
                          "random_std_change": 0.01, "p_value": 0.01}])
  robustness.plot_causal(causal, None, tmp_path / "c.png")
  ax = drawn[-1].axes[0]
  dot = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
  np.testing.assert_allclose(dot.get_xdata(), [scale * -0.1])
  assert ("percentage points" in ax.get_xlabel()) == (scale == 100)


def test_a_group_of_whole_layers_reads_no_test_instead_of_a_p_value(drawn, tmp_path):
  nan = float("nan")
  causal = pd.DataFrame([{"group": "delimiter", "num_heads": 5, "change": -0.1, "metric": "accuracy",
                          "ablation": "remove", "random_mean_change": -0.02,
                          "random_std_change": 0.01, "p_value": 0.01},
                         {"group": "local", "num_heads": 24, "change": -0.2, "metric": "accuracy",
                          "ablation": "remove", "random_mean_change": nan,
                          "random_std_change": nan, "p_value": nan}])
  robustness.plot_causal(causal, None, tmp_path / "c.png")
  texts = [t.get_text() for t in drawn[-1].axes[0].texts]
  assert texts == ["p = 0.010", "no test (whole layers)"]
