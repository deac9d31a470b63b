"""The measures' report sections (Clark et al. 2019) from ``measures.npz`` of an analysis:
attention entropy, attention to special tokens and neighbours, and (when present) heads
embedded by their Jensen-Shannon distances. Each section is ``{"title", "html"}``; the
analysis report appends them. No jax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.report.figures import clark
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report.page import figure_html, table_html

def measures_sections(measures: dict | str | Path, fig_dir, *, num_layers: int | None = None,
                      num_heads: int | None = None, dpi: int = DEFAULT_DPI) -> list[dict]:
  """Report sections of the measures: attention entropy, attention to special tokens and
  neighbours, and (when present) the MDS picture of the Jensen-Shannon distances."""
  m = contract.read_measures(measures) if not isinstance(measures, dict) else measures
  fig_dir = Path(fig_dir)
  entropy = np.nanmean(np.asarray(m["entropy"], float), axis=0)            # [l, h]
  cls_ent = np.nanmean(np.asarray(m["cls_entropy"], float), axis=0)
  token = np.nanmean(np.asarray(m["token_attention"], float), axis=0)      # [l, h, 5]
  L, H = entropy.shape
  names = tuple(m.get("token_measures", clark.TOKEN_MEASURE_LABELS))
  mean_len = float(np.mean(m["lengths"])) if "lengths" in m and len(m["lengths"]) else None
  sections = []
  p_ent = clark.plot_entropy(entropy, cls_ent, fig_dir / "measures_entropy.png",
                             mean_length=mean_len, dpi=dpi)
  per_layer = pd.DataFrame({"layer": np.arange(L), "entropy (mean over heads)": entropy.mean(1),
                            "[CLS] entropy": cls_ent.mean(1)})
  for i, n in enumerate(names):
    per_layer[f"to {clark.TOKEN_MEASURE_LABELS.get(n, n)}"] = token[..., i].mean(1)
  sections.append({"title": "Attention entropy (Clark et al. 2019)", "html": (
      "<p>The entropy (natural log) of each head's attention rows over the real tokens, averaged "
      "over the queries and the sequences; and the entropy of the [CLS] query's row alone. Low "
      "entropy: focused attention; the dotted line is uniform attention over a sequence of mean "
      "length.</p>"
      + figure_html(p_ent, "Attention entropy per head", "Each dot is one head; the line is "
                    "the layer mean.", "Heads near the dotted line attend broadly (a bag of "
                    "words); heads near 0 attend to one token.")
      + table_html(per_layer, table_id="table-measures-layers", float_format="{:.3f}"))})
  p_tok = clark.plot_token_attention(token, fig_dir / "measures_tokens.png", names=names, dpi=dpi)
  sections.append({"title": "Attention to special tokens and neighbours", "html": (
      "<p>Mean attention mass each head puts on [CLS], on [SEP], on commas and periods, and on "
      "the previous and the next token (Clark et al. 2019, Figs. 1-2), averaged over the real "
      "queries (for previous / next: those that have one) and the sequences.</p>"
      + figure_html(p_tok, "Where heads attend", "One panel per target; each dot is one head.",
                    "Middle layers attending heavily to [SEP] is the 'no-op' pattern Clark et al. "
                    "describe; heads near 1 on previous / next are positional heads."))})
  if "js" in m and np.asarray(m["js"]).size:
    js = np.asarray(m["js"], float)
    p_mds = clark.plot_js_mds(js, num_layers or L, num_heads or H, fig_dir / "measures_js_mds.png",
                        dpi=dpi)
    sections.append({"title": "Heads by Jensen-Shannon distance", "html": (
        "<p>The mean Jensen-Shannon distance between the attention rows of every pair of heads "
        "(averaged over the real queries and the sequences), embedded in two dimensions by "
        "multidimensional scaling (Clark et al. 2019, Fig. 6).</p>"
        + figure_html(p_mds, "Heads embedded by Jensen-Shannon distance", "Each dot is one "
                      "head, coloured by layer and labelled layer-head.",
                      "Heads close together attend alike; Clark et al. find heads of the same "
                      "layer tend to cluster."))})
  return sections


def analysis_measures_sections(out_dir, *, dpi: int = DEFAULT_DPI) -> list[dict]:
  """The measures sections for an analysis report: ``[]`` when ``out_dir`` holds no
  ``measures.npz``; figures go to ``out_dir/figures``. For
  ``heads_jax.report.analysis.write_report(..., extra_sections=...)``."""
  out_dir = Path(out_dir)
  if not (out_dir / contract.MEASURES_FILE).is_file():
    return []
  return measures_sections(out_dir / contract.MEASURES_FILE, out_dir / "figures", dpi=dpi)
