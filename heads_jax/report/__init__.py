"""Report stage: figures (matplotlib PNG) and self-contained HTML reports (host side, no jax).

Imports form a tree, leaves first:

* `heads_jax.report.page`: the page toolkit (CSS, escaping, tables, embedded figures, writing
  a page); `style` (colours, markers, cluster order); `tables` (shaping the contract's tables
  for drawing, with the role definitions of `heads_jax.hoststats.roles`).
* `heads_jax.report.figures`: one module per paper reproduced (``pande``, ``guan``, ``clark``,
  ``michel``, ``kovaleva``) over ``figures.common``.
* `heads_jax.report.headline`: the paper's headline figures of ``summary.json``.
* one module per report: `analysis` (`build_analysis_report`: all figures and report.html of an
  analysis directory), `compare` (`write_compare_report`), `ablation` (the sections of
  ``heads-jax ablate``), `measures` (Clark et al.'s measures, part of the analysis report) and
  `index` (the demo's front page).

Every file is read through `heads_jax.contract`.
"""
