"""Figure of Kovaleva et al. 2019 ("Revealing the dark secrets of BERT"), Fig. 5: the cosine
similarity of each head's attention before and after fine-tuning. No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heads_jax.report.figures.common import DEFAULT_DPI, heatmap, new_figure, save_figure
from heads_jax.report.spec import Registry

# The registry of this paper's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry('Kovaleva et al. 2019')


def plot_similarity(similarity, path, *, title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Heatmap ``[l, h]`` of the cosine similarity of each head's attention before and after
  fine-tuning (Kovaleva et al. 2019, Fig. 5)."""
  sim = np.asarray(similarity, float)
  fig = new_figure(max(5.0, 0.55 * sim.shape[1] + 2.2), max(3.0, 0.42 * sim.shape[0] + 1.4))
  ax = fig.add_subplot()
  heatmap(ax, sim, cmap="magma", fmt="{:.2f}", vmin=min(0.0, float(np.nanmin(sim))), vmax=1.0,
           label="cosine similarity")
  ax.set_title(title or "Attention before vs after fine-tuning (cosine)")
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# the registry: how each report draws these figures from its inputs (`heads_jax.report.spec`);
# the drawn title is the plot's own, the report's heading the spec's title


def _draw_similarity(i, path, *, title, dpi):
  """Inputs: ``similarity`` ``[l, h]``."""
  return plot_similarity(i.similarity, path, dpi=dpi)


# name, title, caption (what is drawn), how (how to read it), how each report draws it
FIGURES.register_all({
    'attention_similarity': {
        "title": 'Attention similarity before and after fine-tuning',
        "caption": 'Per-head cosine similarity (rows: layers, columns: heads).',
        "how": ("1 = fine-tuning left the head's attention as it was; lower values mark the "
                'heads fine-tuning changed most (usually the last layers).'),
        "draw": _draw_similarity,
        "needs": ("similarity",),
        "reports": ("compare",),
        "section": "Attention similarity before and after fine-tuning",
        "reproduces": "Fig. 5",
    },
})
