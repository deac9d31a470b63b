"""Report stage: figures (matplotlib PNG) and self-contained HTML reports (host side, no jax).

Main entry points: :func:`heads_jax.report.html.build_analysis_report` (all figures and
``report.html`` from an analysis output directory), :func:`heads_jax.report.html.write_report`,
:func:`heads_jax.report.html.write_compare_report` and the ``plot_*`` functions of
:mod:`heads_jax.report.figures`.
"""
