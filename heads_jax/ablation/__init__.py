"""Head ablation, head importance and pruning, attention similarity (device side + drivers).

Modules:

* ``groups``: groups of heads (cluster types, roles, layers, lists) and their gates (host only);
* ``evaluate``: jitted, data-parallel evaluation of a GLUE classifier under a head gate (its
  batching and metrics: ``heads_jax.data.glue_batches``, as fine-tuning);
* ``ablate``: ablation tables by group and intra/inter-sentence attention removal (Guan et al. 2020);
* ``causal``: the causal test of a group against random groups of the same layers (the one
  random baseline of every group ablation), and mean ablation;
* ``importance``: head importance, the expected absolute gate gradient (Michel et al. 2019);
* ``pruning``: iterative pruning curve by importance against random pruning;
* ``similarity``: per-head attention cosine similarity of two models (Kovaleva et al. 2019);
* ``tasks``: the task a classifier was fine-tuned on, the refusal of another task's data, and the
  model, data and evaluator of a causal job loaded together;
(the ablate job, ``run_ablation(AblationConfig)``, is ``heads_jax.pipelines.ablate``, its stage
kinds ``heads_jax.pipelines.ablation``; entry point: ``analyze/ablate.py``).
"""
