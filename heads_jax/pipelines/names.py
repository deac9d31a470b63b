"""The stage names of every job (what ``--redo STAGE`` takes), in pipeline order: one
definition, light to import, so that each command's ``--help`` lists them without importing
its job (nor JAX). The jobs' pipelines are built from these names.

The analysis is two stages wherever it appears: ``scores`` (the device pass) and ``analysis``
(the host statistics); the comparison likewise: ``similarity`` (device) and ``compare`` (host).
"""

ANALYZE = ("scores", "analysis")
COMPARE = ("comparison", "similarity", "report")
ABLATE = ("baseline", "ablation", "segment_ablation", "importance", "pruning", "paper_tables",
          "attribution", "patching", "carriers", "head_pruning", "report")
TRAJECTORY = ("scores", "analysis", "table")
REPRODUCE = ("data", "pretrained", "finetune", "scores", "analysis", "similarity", "compare",
             "report")
GUAN = ("scores", "analysis", "ablation_baseline", "ablation_paper_tables", "ablation_report",
        "report")
DEMO = ("scores_pretrained", "analysis_pretrained", "finetune", "scores_finetuned",
        "analysis_finetuned", "compare", "pretrain", "scores_scratch", "analysis_scratch",
        "report")
