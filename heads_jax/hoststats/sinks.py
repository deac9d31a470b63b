"""Attention sinks and no-op heads (host, numpy / pandas; no jax).

From the second pass of ``heads_jax.stats.norms`` (per sequence ``[N, l, h]``):
``first_attention`` (mean attention of the real queries on the first token), ``sep_attention``
``[N, l, h, 2]`` (on the first and second ``[SEP]``; NaN where absent) and ``norm_ratio``
(``mean_q ||sum_k a f(x_k)|| / mean_k ||f(x_k)||``).

* A head's value is the mean over the sequences (NaN-aware for the second ``[SEP]``).
* Sink rate (Gu et al. 2025, "When attention sink emerges in language models"): the share of
  heads whose mean first-token attention exceeds ``SINK_THRESHOLD`` = 0.3 (their epsilon).
* The norm ratio: how much of what a head could move it does move; a head that puts its mass on
  tokens whose transformed values are small (Kobayashi et al. 2020) has a small ratio.
* Massive activations (Sun et al. 2024, "Massive activations in large language models"): the
  hidden state's L2 norm at the sink positions against the other tokens', per layer
  (``hidden_norms`` ``[N, l + 1, 3]``: the first token, the mean over the ``[SEP]`` positions,
  the median over the other real tokens; entry 0 is the embeddings, entry ``i`` layer ``i``'s
  output, before any final norm). A post-LN model (BERT) renormalises every layer's output, so
  its ratios stay near 1; a pre-norm model (ModernBERT) keeps an un-normalised residual stream,
  where a sink token's state can grow to many times the others': ``activation_summary`` gives
  the ratios by layer so the two kinds of model can be put side by side.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

SINK_THRESHOLD = 0.3
HEAD_COLUMNS = ("layer", "head", "first_attention", "sep1_attention", "sep2_attention",
                "norm_ratio", "sink")


def _check(first, sep, ratio):
  first, sep, ratio = (np.asarray(x, np.float64) for x in (first, sep, ratio))
  if first.ndim != 3 or ratio.shape != first.shape or sep.shape != first.shape + (2,):
    raise ValueError(f"need first_attention [N, l, h], sep_attention [N, l, h, 2], norm_ratio "
                     f"[N, l, h]; got {first.shape}, {sep.shape}, {ratio.shape}")
  return first, sep, ratio


def head_sinks(first_attention, sep_attention, norm_ratio,
               threshold: float = SINK_THRESHOLD) -> pd.DataFrame:
  """One row per head (``HEAD_COLUMNS``): the means over sequences and ``sink`` (mean first-token
  attention > ``threshold``)."""
  first, sep, ratio = _check(first_attention, sep_attention, norm_ratio)
  _, L, H = first.shape
  layer, head = np.indices((L, H)).reshape(2, -1)
  with np.errstate(invalid="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # mean of an all-NaN second [SEP]
    sep_mean = np.nanmean(sep, axis=0)
  f = first.mean(0).reshape(-1)
  return pd.DataFrame({"layer": layer, "head": head, "first_attention": f,
                       "sep1_attention": sep_mean[..., 0].reshape(-1),
                       "sep2_attention": sep_mean[..., 1].reshape(-1),
                       "norm_ratio": ratio.mean(0).reshape(-1), "sink": f > threshold},
                      columns=list(HEAD_COLUMNS))


def sink_summary(first_attention, sep_attention, norm_ratio,
                 threshold: float = SINK_THRESHOLD) -> dict:
  """``summary.json`` keys: ``sink_threshold``, ``sink_rate`` (share of heads), ``sink_heads``
  ("layer:head"), ``mean_first_attention``, ``mean_norm_ratio``, and per layer
  ``sink_rate_by_layer``, ``first_attention_by_layer``, ``sep_attention_by_layer`` (both
  [SEP]s together) and ``norm_ratio_by_layer`` (lists of l numbers)."""
  heads = head_sinks(first_attention, sep_attention, norm_ratio, threshold)
  by_layer = heads.groupby("layer")
  sep_both = heads[["sep1_attention", "sep2_attention"]].sum(axis=1, min_count=1)
  return {
      "sink_threshold": float(threshold),
      "sink_rate": float(heads["sink"].mean()),
      "sink_heads": [f"{l}:{h}" for l, h in heads.loc[heads["sink"], ["layer", "head"]].to_numpy()],
      "mean_first_attention": float(heads["first_attention"].mean()),
      "mean_norm_ratio": float(heads["norm_ratio"].mean()),
      "sink_rate_by_layer": [float(x) for x in by_layer["sink"].mean()],
      "first_attention_by_layer": [float(x) for x in by_layer["first_attention"].mean()],
      "sep_attention_by_layer": [float(x) for x in sep_both.groupby(heads["layer"]).mean()],
      "norm_ratio_by_layer": [float(x) for x in by_layer["norm_ratio"].mean()],
  }


HIDDEN_NORM_PARTS = ("first", "sep", "other")


def activation_summary(hidden_norms) -> dict:
  """``summary.json`` keys from ``hidden_norms`` float ``[N, l + 1, 3]`` (module docstring):
  ``hidden_norm_by_layer`` ({part: l + 1 means over the sequences}), ``first_norm_ratio_by_layer``
  and ``sep_norm_ratio_by_layer`` (the mean over sequences of first / other and [SEP] / other,
  l + 1 numbers; NaN where a sequence has no other token or no [SEP]), and
  ``max_first_norm_ratio`` (the largest of the first-token ratios)."""
  x = np.asarray(hidden_norms, np.float64)
  if x.ndim != 3 or x.shape[2] != len(HIDDEN_NORM_PARTS):
    raise ValueError(f"hidden_norms must be [N, l + 1, {len(HIDDEN_NORM_PARTS)}]; got {x.shape}")
  other = np.where(x[..., 2] > 0, x[..., 2], np.nan)
  with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (no [SEP] anywhere)
    means = np.nanmean(x, axis=0)                                     # [l + 1, 3]
    first = np.nanmean(x[..., 0] / other, axis=0)
    sep = np.nanmean(x[..., 1] / other, axis=0)
  as_list = lambda a: [None if np.isnan(v) else float(v) for v in a]  # noqa: E731
  return {
      "hidden_norm_by_layer": {p: as_list(means[:, j]) for j, p in enumerate(HIDDEN_NORM_PARTS)},
      "first_norm_ratio_by_layer": as_list(first),
      "sep_norm_ratio_by_layer": as_list(sep),
      "max_first_norm_ratio": None if np.all(np.isnan(first)) else float(np.nanmax(first)),
  }
