"""The jobs a user runs, each a pipeline of keyed stages over one engine (``engine``).

Modules:

* ``engine``: keyed stages and units, markers written last, ``redo`` cascading to later stages;
* ``analyze``: one analysis (``run_analysis(AnalysisConfig)``; entry point ``analyze/heads.py``);
* ``compare``: two analyses side by side (``run_compare``; ``analyze/compare.py``);
* ``ablate``: head ablation, importance and pruning (``run_ablation``; ``analyze/ablate.py``), its
  stage kinds in ``ablation`` (which ``guan`` composes too), as ``analysis`` and ``comparison``
  hold the analysis's and the comparison's;
* ``reproduce``: Pande et al. end to end (``run_reproduce``; ``analyze/reproduce.py``);
* ``demo``: the paper's findings on a real model, offline (``run_demo``; ``analyze/demo.py``);
* ``guan``: Guan et al. end to end (``run_guan``; ``reproduce`` with a guan preset);
* ``trajectory``: roles over training, every kept checkpoint analysed (``run_trajectory``;
  ``analyze/trajectory.py``).

Each job hands the engine one typed config (``ctx.config``); its stages read it and the earlier
stages' typed results (``ctx.results``) only.

The files a pipeline writes at run level (stage markers, reproduce's best/analyses files, the
demo's ``demo.json``) are read and written by ``heads_jax.runfiles`` only.
"""
