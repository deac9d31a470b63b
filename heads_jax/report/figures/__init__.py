"""Figures of the reports, one module per paper they reproduce (matplotlib, PNG; no jax).

* `heads_jax.report.figures.pande`: Pande et al. 2021, Figs. 3-6 (sieve bias scores, p-values,
  role overlap, role grid, mean sieve bias per head, change after fine-tuning).
* `heads_jax.report.figures.guan`: Guan et al. 2020, Figs. 1-3 and Table 3 (head clusters, their
  distance features and change after fine-tuning; ablation by head group and by segment).
* `heads_jax.report.figures.clark`: Clark et al. 2019 (attention entropy, attention to special
  tokens and neighbours, heads by Jensen-Shannon distance).
* `heads_jax.report.figures.michel`: Michel et al. 2019 (head importance, pruning curve).
* `heads_jax.report.figures.kovaleva`: Kovaleva et al. 2019 (attention similarity before and
  after fine-tuning).
* `heads_jax.report.figures.robustness`: issue 26 (roles under norm weights, attention sinks,
  heads as parsers, the causal test of a role, roles over training).
* `heads_jax.report.figures.deberta`: DeBERTa's attention terms per head (issue 40: each head's
  share of its logits' variance from the c2c, c2p and p2c terms).
* `heads_jax.report.figures.hao`: which heads carry the prediction (issue 51: attribution, Hao
  et al. 2021, and patching per head beside the roles; pruning curves on held-out rows).
* `heads_jax.report.figures.common`: what they share (figure creation, saving, heatmaps).

Every ``plot_xxx(..., path) -> Path`` draws one figure from plain arrays / DataFrames (the
contract files of DESIGN.md section 4, or the ablation's CSV tables) and writes it as a PNG at
``path`` (parent folders are created). ``FIGURES`` of a paper module is its registry
(`heads_jax.report.spec.Registry`): one `Figure` spec per figure (name, title, caption, "how to
read this" line, draw function, the reports and section that show it, the paper's figure it
reproduces); the reports draw and place their figures from these registries. Nothing statistical is
computed here beyond simple means and counts for drawing.

Axis letters in shapes: b sequence (batch), l layer, h head, r role, d feature.
"""

PAPERS = ("pande", "guan", "clark", "michel", "kovaleva", "robustness", "deberta", "hao")


def paper_modules():
  """The paper modules, in the order of `PAPERS` (each has a ``FIGURES`` registry)."""
  import importlib
  return tuple(importlib.import_module(f"heads_jax.report.figures.{p}") for p in PAPERS)
