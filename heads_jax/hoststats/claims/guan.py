"""Guan et al.'s claims: "How far does BERT look at" (COLING 2020).

Full text in ``shared/papers/guan2020_how_far_does_bert_look_at.txt``; every claim quotes its
sentence. Section 4 (cluster shares and layers), Table 1 (stability), Fig. 4 (fine-tuning),
Tables 2-3 (the SQuAD ablations). Their numbers are about their model (`PAPER_MODELS`); on a
GLUE run or another SQuAD model they are shown, not judged. The checks are in
`heads_jax.hoststats.claims.guan_checks`.
"""

from __future__ import annotations

from heads_jax.hoststats.claims.claim import (
    GUAN, PAPER_MODELS, TASKS, Claim, wilson_rule)

_CROSS_MODEL = ("Guan et al. analysed " + PAPER_MODELS[GUAN] + "; judged only on the guan "
                "pipeline with their model (elsewhere: not comparable, the value shown)")
# Guan et al.'s claims read the SQuAD model's analysis where the run has one (the guan
# pipeline), else each GLUE task's (reproduce; then not comparable).
GUAN_TASKS = ("squad",) + TASKS + ("mnli",)



CLUSTER_TYPES = ("dense", "diagonal", "dense+vertical", "vertical")
_GUAN_SHARES = {
    "dense": (0.2604, "26.04%", "They account for 26.04% of total heads and mainly appear at the "
                                "beginning layers.", ""),
    "diagonal": (0.2556, "25.56%", "They account for 25.56% of total heads and appear at almost all "
                                   "layers.",
                 "most likely a typo for 26.56% (= 102 of 384 heads): the four printed shares sum "
                 "to 98.99%, and 26.04, 34.11 and 13.28% are exactly 100, 131 and 51 of 384; the "
                 "printed value is compared"),
    "dense+vertical": (0.3411, "34.11%", "They account for 34.11% of total heads and mainly "
                                         "appear at middle layers.", ""),
    "vertical": (0.1328, "13.28%", "They account for 13.28% of total heads and mainly appear at "
                                   "higher layers.", ""),
}
_GUAN_PLACEMENT = {
    "dense": ("mainly at the beginning layers", "first"),
    "diagonal": ("at almost all layers", "all"),
    "dense+vertical": ("mainly at the middle layers", "middle"),
    "vertical": ("mainly at the higher layers", "last"),
}

_GUAN_CLUSTERS = (
    *(Claim(f"guan_share_{name.replace('+', '_')}", GUAN, f"share of heads of the {name} type",
            v, "share", f"cluster_share:{name}", "finetuned", "mean_over_tasks",
            "section 4 \"Clustering\"", printed=printed, quote=quote, tasks=GUAN_TASKS,
            measure="share of heads the clustering (K-means, k = 4, types named by Guan et al.'s "
                    "definitions, `heads_jax.hoststats.clustering`) gives the type " + name
                    + "; the SQuAD model's (mean over the tasks' fine-tuned models elsewhere)",
            rule=wilson_rule(), interval="wilson",
            note="; ".join(x for x in (typo, _CROSS_MODEL) if x))
      for name, (v, printed, quote, typo) in _GUAN_SHARES.items()),
    *(Claim(f"guan_layers_{name.replace('+', '_')}", GUAN, f"{name} heads appear {where}", None,
            "text", None, "finetuned", "tasks", "section 4 \"Clustering\" (Fig. 3)",
            quote=_GUAN_SHARES[name][2], tasks=GUAN_TASKS,
            measure=("per clustering (each model separately), layers with at least one " + name
                     + " head" if rule == "all" else "per clustering (each model separately), the "
                     "median layer of the " + name + " heads"),
            rule=("holds when in every clustering at least 80% of the layers have one"
                  if rule == "all" else
                  f"holds when in every clustering the median layer lies in the {rule} third of "
                  "the layers"),
            check=f"cluster_layers:{name}:{rule}", note=_CROSS_MODEL)
      for name, (where, rule) in _GUAN_PLACEMENT.items()),
)

# Table 1: stability of the clustering per model.
_GUAN_STABILITY = (("pretrained", None, 0.9598, "95.98%", "Pre-train"),
                   ("finetuned", "squad", 0.9626, "96.26%", "SQuAD"),
                   ("finetuned", "mrpc", 0.9598, "95.98%", "MRPC"),
                   ("finetuned", "mnli", 0.9437, "94.37%", "MNLI"))
_STABILITY_MEASURE = ("fraction of heads whose (Hungarian-aligned) cluster is the same in all 10 "
                      "K-means fits on random halves of the heads (DESIGN.md section 3); Guan et "
                      "al.: \"the proportion of input samples that is consistent on all models "
                      "fitted with the random partial training set split\"")
_GUAN_TABLE1 = (
    *(Claim(f"guan_stability_{label.lower().replace('-', '')}", GUAN,
            f"stability of the clustering, {label} model", v, "share", "cluster_stability", model,
            "task" if task else "mean_over_tasks", "Table 1", task=task,
            tasks=(task,) if task else GUAN_TASKS, printed=printed,
            quote="Pre-train SQuAD MRPC MNLI Stability 95.98% 96.26% 95.98% 94.37% Table 1: "
                  "Stability of clustering measured following Von Luxburg (2010) on downstream "
                  "tasks.",
            measure=_STABILITY_MEASURE + ("; mean over the pre-trained model's analyses of the "
                                          "tasks" if model == "pretrained" else
                                          f"; the {label}-fine-tuned model"),
            rule=wilson_rule(), interval="wilson", note=_CROSS_MODEL)
      for model, task, v, printed, label in _GUAN_STABILITY),
    Claim("guan_stability_over_95", GUAN, "over 95% of the heads are clustered stably", None,
          "text", None, "finetuned", "tasks", "section 4 \"Clustering\" (Table 1)",
          quote="Our result demonstrates that over 95% attention heads are clustered stably with "
                "a limited amount of data.",
          measure="the stability of every analysed model (pre-trained and fine-tuned, each task), "
                  "their mean",
          rule="holds when the mean over the analysed models is at least 95% (`STABLE_BAR`; "
               "Guan et al.'s own Table 1 averages 95.65% with MNLI at 94.37%: the sentence "
               "summarises the table)", check="stability_over_95", note=_CROSS_MODEL),
    Claim("guan_stable_3_5", GUAN, "the clustering is also stable with 3 or 5 clusters", None,
          "text", None, "finetuned", "task", "section 4 \"Clustering\"", task="squad",
          tasks=("squad",),
          quote="We still get stable clustering results with 3 or 5 clusters, but the patterns "
                "can not be distinguished by human-being.",
          measure="the SQuAD model's heads clustered with k = 3 and k = 5 (same method, seed and "
                  "10 half-sample fits as Table 1)",
          rule="holds when each is at least 95% (`STABLE_BAR`, the bar of \"over 95% attention "
               "heads are clustered stably\")", check="stable_3_5", note=_CROSS_MODEL),
    Claim("guan_similar_after_finetuning", GUAN, "fine-tuned models share the pre-trained type "
          "distribution", None, "text", None, "change", "tasks", "section 4 (Fig. 4)",
          quote="In specific, all the four models share similar head type distribution "
                "described in Fig. 3.",
          tasks=GUAN_TASKS,
          measure="per task, the share of each cluster type in the fine-tuned and the pre-trained "
                  "analysis of the same sequences",
          rule="holds when, in every task, each type's fine-tuned share lies in the 95% Wilson "
               "interval of its pre-trained share over the heads (\"similar\": within the "
               "share's sampling uncertainty)",
          check="cluster_similar", note=_CROSS_MODEL),
    Claim("guan_same_cluster_after_finetuning", GUAN, "most heads keep their type after "
          "fine-tuning; changes are in the highest layers", None, "text", None, "change", "tasks",
          "section 4 (Fig. 4)", tasks=GUAN_TASKS,
          quote="Empirically, we find many heads have the same cluster after fine-tuning process. "
                "However, some heads in the highest layers also change.",
          measure="per task, heads with the same cluster type before and after fine-tuning; the "
                  "share of changed heads per layer third, the tasks pooled",
          rule="holds when more than half of the heads keep their type in every task and the "
               "final third of the layers has the highest share of changed heads",
          check="cluster_kept", note=_CROSS_MODEL),
)

# Tables 2 and 3 (SQuAD v1.1 dev, BERT-large fine-tuned on SQuAD, no re-training after the
# ablation). In the extracted text the check marks print as "3" (kept) and "7" (removed).
# Table 2: per type (dense, diagonal, dense+vertical, vertical) kept / "pruned" / "1/L"
# (substituted by uniform attention); EM ("Acc.") and F1.
GUAN_TABLE2 = (
    (1, ("kept", "kept", "kept", "kept"), 82.85, 89.68),
    (2, ("pruned", "kept", "kept", "kept"), 79.92, 87.62),
    (3, ("kept", "pruned", "kept", "kept"), 4.59, 7.55),
    (4, ("kept", "kept", "pruned", "kept"), 73.33, 81.92),
    (5, ("kept", "kept", "kept", "pruned"), 81.42, 88.57),
    (6, ("pruned", "kept", "kept", "pruned"), 75.31, 84.05),
    (7, ("kept", "kept", "pruned", "pruned"), 56.87, 67.62),
    (8, ("1/L", "kept", "kept", "kept"), 74.68, 84.17),
    (9, ("kept", "1/L", "kept", "kept"), 1.27, 6.07),
    (10, ("kept", "kept", "1/L", "kept"), 9.13, 11.15),
    (11, ("kept", "kept", "kept", "1/L"), 53.17, 59.09),
)
# Table 3: per type, (intra, inter) sentence attention kept (True) or removed (False).
GUAN_TABLE3 = (
    (12, ((True, True), (False, True), (True, True), (True, True)), 16.96, 25.29),
    (13, ((True, True), (True, False), (True, True), (True, True)), 82.29, 89.91),
    (14, ((True, True), (True, True), (False, True), (True, True)), 80.28, 87.76),
    (15, ((True, True), (True, True), (True, False), (True, True)), 77.95, 85.86),
    (16, ((False, True), (True, True), (False, True), (False, True)), 71.80, 80.22),
    (17, ((True, False), (True, True), (True, False), (True, False)), 10.11, 15.57),
    (18, ((False, True), (False, True), (True, True), (False, True)), 14.83, 23.55),
    (19, ((True, False), (True, False), (True, True), (True, False)), 75.54, 84.10),
)
SQUAD_REASON = ("a SQuAD ablation (EM/F1 of BERT-large fine-tuned on SQuAD); the reproduce run "
                 "fine-tunes GLUE classifiers (the guan pipeline, `configs/reproduce.py:guan`, "
                 "computes it)")


def _table2_setting(types) -> str:
  parts = [f"{n} {s}" for n, s in zip(CLUSTER_TYPES, types) if s != "kept"]
  return "; ".join(parts) or "baseline (nothing removed)"


def _table3_setting(types) -> str:
  parts = []
  for n, (intra, inter) in zip(CLUSTER_TYPES, types):
    gone = [p for p, kept in (("intra", intra), ("inter", inter)) if not kept]
    if gone:
      parts.append(f"{n} {'+'.join(gone)}-sentence removed")
  return "; ".join(parts)


_GUAN_ABLATION_NOTE = ("EM and F1 on SQuAD v1.1 dev (\"Acc.\" is EM; percent, as the paper), "
                       "BERT-large fine-tuned on SQuAD, no re-training")
_GUAN_TABLES = (
    *(Claim(f"guan_table2_row{i}", GUAN, f"Table 2 row {i}: {_table2_setting(t)}", em,
            "score", None, "finetuned", "task", "section 5.1, Table 2", task="squad",
            tasks=("squad",), printed=f"{em:.2f} / {f1:.2f}",
            quote="Tbl. 2 reports the experimental results with different settings.",
            measure="EM (percent) of the ablated model on the evaluated questions (F1 in the "
                    "detail)", rule=wilson_rule("evaluated questions") + " (EM)",
            interval="wilson", check=f"squad_row:{i}", note=_GUAN_ABLATION_NOTE)
      for i, t, em, f1 in GUAN_TABLE2),
    *(Claim(f"guan_table3_row{i}", GUAN, f"Table 3 row {i}: {_table3_setting(t)}", em,
            "score", None, "finetuned", "task", "section 5.2, Table 3", task="squad",
            tasks=("squad",), printed=f"{em:.2f} / {f1:.2f}",
            quote="Tbl. 3 demonstrates the experimental results.",
            measure="EM (percent) of the model with that attention removed (F1 in the detail)",
            rule=wilson_rule("evaluated questions") + " (EM)", interval="wilson",
            check=f"squad_row:{i}",
            note=_GUAN_ABLATION_NOTE + ("; the text says \"Removing intra-sentence attention "
                                        "from diagonal type ( 12 ) leads to a poor accuracy of "
                                        "19.96%\": the table prints 16.96" if i == 12 else ""))
      for i, t, em, f1 in GUAN_TABLE3),
    *(Claim(key, GUAN, text, None, "text", None, "finetuned", "task", source, task="squad",
            tasks=("squad",), quote=quote, measure="SQuAD EM (percent) of the ablated models",
            rule=rule, check=f"squad_statement:{key}", note=_GUAN_ABLATION_NOTE)
      for key, text, source, quote, rule in (
          ("guan_prune_diagonal", "pruning the diagonal heads makes the model inoperative",
           "section 5.1", "Firstly, we find that pruning all diagonal heads ( 3 ) makes the model "
           "totally inoperative, compared with ( 2 , 4 , 5 ).",
           "holds when row 3's EM is at most a tenth of row 1's (\"totally inoperative\"; "
           "Guan: 4.59 of 82.85) and its loss is larger than rows 2, 4 and 5's (\"compared "
           "with\")"),
          ("guan_prune_vertical", "pruning the vertical heads costs less than 1.5% accuracy",
           "section 5.1", "Pruning all vertical heads directly ( 5 ) has less than 1.5% accuracy "
           "loss.", "holds when the EM loss is below 1.5 points"),
          ("guan_keep_dense_vertical", "keeping dense&vertical beside diagonal is better than "
           "keeping dense", "section 5.1", "Keeping dense&vertical type ( 6 ) together results "
           "in a better accuracy.", "holds when row 6's EM exceeds row 7's"),
          ("guan_uniform_dense", "dense heads replaced by uniform attention lose less than 10%",
           "section 5.1", "Nextly, we find that substituting the dense type with uniformed "
           "attention ( 8 ) results in accuracy loss of less than 10%.",
           "holds when the EM loss is below 10 points"),
          ("guan_uniform_dense_vertical", "dense&vertical heads replaced by uniform attention "
           "lose much", "section 5.1", "However, substituting the mixed type dense&vertical ( 10 "
           ") has a significant accuracy loss, which indicates its crucial role.",
           "holds when the EM loss is significant (one-sided two-proportion z-test over the "
           "evaluated questions, p < 0.05) and larger than that of substituting dense (row 8, "
           "the \"However\" it is set against)"),
          ("guan_uniform_vertical", "vertical heads replaced by uniform attention keep over 50% "
           "accuracy", "section 5.1", "Substituting Vertical type ( 11 ) also has an accuracy of "
           "over 50%.", "holds when row 11's EM is above 50"),
          ("guan_diagonal_intra", "without the diagonal heads' intra-sentence attention accuracy "
           "is poor", "section 5.2", "Removing intra-sentence attention from diagonal type ( 12 ) "
           "leads to a poor accuracy of 19.96%, while removing inter-sentence part ( 13 ) has "
           "little interference.", "holds when row 12's EM is at most half of row 1's (\"poor\") and row "
           "13 loses less than 1.5 points (\"little interference\": the paper's own bar for a "
           "small loss, row 5)"),
          ("guan_dense_vertical_inter", "dense&vertical heads carry the inter-sentence "
           "information", "section 5.2", "On the contrast, with dense&vertical attending other "
           "sentences solely ( 19 ), the model reaches an accuracy of 75.54%.",
           "holds when row 19's EM exceeds row 17's"),
      )),
)


CLAIMS: tuple[Claim, ...] = _GUAN_CLUSTERS + _GUAN_TABLE1 + _GUAN_TABLES
