"""The look of the report: role and cluster colours, the role grid's markers, cluster order.

The role definitions themselves (coarse roles, role order, layer groups) are those of
`heads_jax.hoststats.roles`; this module only says how to draw them. No jax.
"""

from __future__ import annotations

from heads_jax.data import vocabulary

# The role table comes from the role registry (`heads_jax.data.vocabulary.REGISTRY`): the fine
# roles of the role grid (Pande et al. Fig. 5) in the order of their markers, each one's marker
# (one shape per coarse role), colour and label; the coarse roles' colours.
GRID_ROLES = vocabulary.GRID_ROLES
GRID_MARKERS = {r.name: r.marker for r in vocabulary.REGISTRY if r.marker is not None}
ROLE_COLORS = {r.name: r.color for r in vocabulary.REGISTRY}
ROLE_LABELS = {r.name: r.label for r in vocabulary.REGISTRY}
COARSE_COLORS = dict(vocabulary.COARSE_COLORS)

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
