"""DeBERTa's attention terms per head (issue 40 item 3; He et al. 2021's disentangled attention)
from ``measures.npz``'s ``term_shares``: for each head, the share of its attention logits'
variance over the keys that comes from the content-to-content, content-to-position and
position-to-content terms (docs/DESIGN.md section 3, "DeBERTa-v3"). No jax.
"""

from __future__ import annotations

import numpy as np

from heads_jax.report.figures.common import DEFAULT_DPI, heatmap, new_figure, save_figure
from heads_jax.report.spec import Registry

TERM_LABELS = {"c2c": "content to content", "c2p": "content to position",
               "p2c": "position to content"}

# The registry of this model's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry("He et al. 2021 (DeBERTa)")


def plot_term_shares(term_shares, path, *, names=tuple(TERM_LABELS), dpi: int = DEFAULT_DPI):
  """Three layer x head heatmaps, one per term: ``term_shares`` ``[l, h, 3]`` (means over the
  sequences), each cell the share of that head's logit variance from the term (0..1; a
  negative share, a term working against the others, shows at the bottom of the scale)."""
  shares = np.asarray(term_shares, float)
  L, H, T = shares.shape
  fig = new_figure(min(4.2 * T, 14.0), 0.9 + 0.36 * L + 1.2)
  axes = fig.subplots(1, T)
  for t, ax in enumerate(np.atleast_1d(axes)):
    heatmap(ax, shares[..., t], cmap="viridis", vmin=0.0, vmax=1.0, label="share of variance")
    ax.set_title(TERM_LABELS.get(names[t], names[t]) + f" ({names[t]})", fontsize=10)
  return save_figure(fig, path, dpi)


def _draw_term_shares(i, path, *, title, dpi):
  """Inputs: ``term_shares`` ``[l, h, 3]`` (means over the sequences) and ``term_names``."""
  return plot_term_shares(i.term_shares, path, names=tuple(i.term_names or TERM_LABELS), dpi=dpi)


FIGURES.section("measures", "DeBERTa's attention terms: content or position", (
    "<p>A DeBERTa head's logit of a query on a key is the sum of a content-to-content, a "
    "content-to-position and a position-to-content term (He et al. 2021; positions are the "
    "bucketed token offsets). The share of a term is its covariance with the logits over the keys "
    "of each query, divided by the logits' variance, summed over the queries: softmax ignores "
    "what is constant over a row, so this is what each term contributes to where the head "
    "attends. The shares sum to 1; a negative share works against the others. A head with a "
    "large content-to-position plus position-to-content share is positional; one with a large "
    "content-to-content share reads content. No BERT-style model can make this split.</p>"))

FIGURES.register_all({
    "measures_term_shares": {
        "title": "Where DeBERTa's attention logits vary: content or position",
        "caption": "One panel per term; each cell is one head's share (mean over the sequences).",
        "how": ("Bright c2c and dark c2p/p2c: the head attends by content; the reverse: by position "
                "(its pattern follows token offsets)."),
        "draw": _draw_term_shares,
        "needs": ("term_shares",),
        "reports": ("measures",),
        "section": "DeBERTa's attention terms: content or position",
        "reproduces": "",
    },
})
