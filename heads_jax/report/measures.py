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
from heads_jax.hoststats.terms import mean_term_shares
from heads_jax.report.figures import clark
from heads_jax.report.figures.common import DEFAULT_DPI
from heads_jax.report import spec
from heads_jax.report.page import table_html

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
  js = np.asarray(m["js"], float) if "js" in m else None
  # DeBERTa: each head's share of its logits' variance from the c2c, c2p and p2c terms
  shares = mean_term_shares(m["term_shares"]) if "term_shares" in m else None
  drawn = spec.draw("measures", spec.Inputs(
      entropy=entropy, cls_entropy=cls_ent, mean_length=mean_len, token_attention=token,
      token_names=names, js=js, num_layers=num_layers or L, num_heads=num_heads or H,
      term_shares=shares, term_names=m.get("term_names")),
      fig_dir, dpi=dpi)
  figure = {name: spec.figures_html({name: path}) for name, path in drawn.items()}
  per_layer = pd.DataFrame({"layer": np.arange(L), "entropy (mean over heads)": entropy.mean(1),
                            "[CLS] entropy": cls_ent.mean(1)})
  for i, n in enumerate(names):
    per_layer[f"to {clark.TOKEN_MEASURE_LABELS.get(n, n)}"] = token[..., i].mean(1)
  tables = {"measures_entropy": table_html(per_layer, table_id="table-measures-layers",
                                           float_format="{:.3f}")}
  # the registered sections of the measures report (`heads_jax.report.spec`), in figure order:
  # the section's paragraph, its drawn figures, then this report's tables for them
  sections: dict[str, dict] = {}
  for fig in spec.figures_for("measures"):
    if fig.name in drawn:
      sec = sections.setdefault(fig.section, {
          "title": fig.section, "html": spec.section("measures", fig.section).intro})
      sec["html"] += figure[fig.name] + tables.get(fig.name, "")
  sections = list(sections.values())
  return sections


def analysis_measures_sections(out_dir, *, dpi: int = DEFAULT_DPI) -> list[dict]:
  """The measures sections for an analysis report: ``[]`` when ``out_dir`` holds no
  ``measures.npz``; figures go to ``out_dir/figures``. For
  ``heads_jax.report.analysis.write_report(..., extra_sections=...)``."""
  out_dir = Path(out_dir)
  if not (out_dir / contract.MEASURES_FILE).is_file():
    return []
  return measures_sections(out_dir / contract.MEASURES_FILE, out_dir / "figures", dpi=dpi)
