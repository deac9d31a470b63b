"""The look of the report: role and cluster colours, the role grid's markers, cluster order.

The role definitions themselves (coarse roles, role order, layer groups) are those of
`heads_jax.hoststats.roles`; this module only says how to draw them. No jax.
"""

from __future__ import annotations

# The nine fine roles of the role grid (Pande et al. Fig. 5), in the order of their markers,
# and each one's marker (one shape per coarse role).
GRID_ROLES = ("cls", "sep", "nsubj", "obj", "amod", "advmod", "prev_local", "next_local", "block")
GRID_MARKERS = {"cls": "s", "sep": "s", "nsubj": "^", "obj": "^", "amod": "^", "advmod": "^",
                "prev_local": "o", "next_local": "o", "block": "D"}

ROLE_COLORS = {
    "cls": "#1f77b4", "sep": "#17becf", "delimiter": "#2c7fb8",
    "nsubj": "#d62728", "obj": "#ff7f0e", "amod": "#e377c2", "advmod": "#8c564b",
    "syntactic": "#b2182b",
    "prev_local": "#2ca02c", "next_local": "#98df8a", "local": "#1b7837",
    "block": "#9467bd", "block_plain": "#c5b0d5",
}

COARSE_COLORS = {"local": "#1b7837", "syntactic": "#b2182b", "delimiter": "#2c7fb8",
                 "block": "#9467bd"}

# Cluster names of Guan et al. and their colours; unknown names get the fallback cycle.
CLUSTER_ORDER = ("dense", "diagonal", "dense+vertical", "vertical")
CLUSTER_COLORS = {"dense": "#4daf4a", "diagonal": "#e41a1c", "dense+vertical": "#ff7f00",
                  "vertical": "#377eb8"}
FALLBACK_COLORS = ("#984ea3", "#a65628", "#f781bf", "#999999", "#66c2a5", "#fc8d62")

LAYER_GROUP_COLORS = {"initial": "#a6cee3", "middle": "#1f78b4", "final": "#08306b"}


def cluster_order(names) -> list[str]:
  """Cluster names in the canonical order (dense, diagonal, dense+vertical, vertical), then others."""
  names = list(dict.fromkeys(str(n) for n in names))
  known = [c for c in CLUSTER_ORDER if c in names]
  return known + sorted(n for n in names if n not in CLUSTER_ORDER)


def cluster_colors(names) -> dict[str, str]:
  """A colour per cluster name (canonical colours for Guan et al.'s four types)."""
  out, extra = {}, iter(FALLBACK_COLORS * 10)
  for n in cluster_order(names):
    out[n] = CLUSTER_COLORS.get(n) or next(extra)
  return out
