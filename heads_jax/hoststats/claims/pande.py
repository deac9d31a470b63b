"""Pande et al.'s claims: "The heads hypothesis" (AAAI 2021) and the first author's blog post.

Full text in ``shared/papers/`` (``pande2021_heads_hypothesis.txt``, ``pande2021_blog.txt``);
every claim quotes its sentence. Fig. 3 (scores and p-values pooled), Fig. 4 (co-location),
Fig. 5 (layers), Fig. 6 (fine-tuning), the setup, and the blog's placements. The checks their
``check`` names are in `heads_jax.hoststats.claims.pande_checks`.

Layers. The paper numbers layers from 0 ("block heads are prevalent in the zeroth layer"); its
layer ranges are BERT-base's 12 layers, scaled to the run's depth by
`heads_jax.hoststats.claims.run.bert_base_layers`; such a verdict says "scaled".
"""

from __future__ import annotations

from heads_jax.hoststats.claims.claim import (
    BLOG, PAIR_TASKS, PANDE, TASK_NAMES, Claim, wilson_rule)

_SCALED = "layer ranges are BERT-base's (12 layers, from 0), scaled to the run's depth"
_FT = "each task's fine-tuned model on its own task's analysed sequences"
# The rule of an overlap statement: against its base rate (`heads_jax.hoststats.claims.bars`).
_ENRICHED = ("holds when more {a} heads are {b} heads than the heads' marginal rates give by "
             "chance (one-sided exact hypergeometric test over the model's distinct heads, "
             "p < 0.05), does not hold when fewer (the other tail, p < 0.05), undecided at this n "
             "otherwise; the enrichment (observed over chance) is reported")


def _enriched(check: str) -> str:
  """The overlap rule of the check ``"fine_overlap:A:B"`` (A's heads among B's)."""
  _, a, b = check.split(":")
  return _ENRICHED.format(a=a, b=b)


_PANDE_FIG3 = (
    Claim("mean_sieve_score", PANDE, "mean of all sieve bias scores (pooled)", 2.8, "float",
          "mean_sieve_score", "finetuned", "pooled",
          "section \"Assigning functional roles to heads\" (choice of tau; Fig. 3a)",
          printed="around 2.8",
          quote="we plot the cumulative frequency distribution (see Figure 3(a)) of the sieve bias "
                "score across all functional roles for 1,000 input sequences, and identify that "
                "the mean sieve bias score is around 2.8",
          measure="mean of every sieve bias score of the four functional roles (local, syntactic, "
                  "block, delimiter; `PAPER_ROLES`) over all analysed sequences and heads of " + _FT
                  + ", the tasks pooled",
          rule="holds when this run's mean is within 0.3 of 2.8 (\"around 2.8\")", tolerance=0.3),
    Claim("tau", PANDE, "tau: the smallest integer larger than the mean sieve score", 3.0, "float",
          "auto_tau", "finetuned", "pooled", "section \"Assigning functional roles to heads\"",
          printed="3",
          quote="We then set τ to be the smallest integer larger than this mean, i.e., 3.",
          measure="floor(pooled mean sieve score) + 1 (the paper's rule on this run's pool); the "
                  "run's tests use the configured tau (3, as the paper)",
          rule="holds when the rule gives 3", tolerance=0.0),
    Claim("share_p_between", PANDE, "share of p-values in (0.05, 0.95)", 0.018, "share",
          "share_p_between", "finetuned", "pooled",
          "section \"Assigning functional roles to heads\" (Fig. 3b)", printed="1.8%",
          quote="Indeed, there are only 1.8% of points in the range (0.05, 0.95).",
          measure="share of the unadjusted p-values of the four functional roles' tests (every "
                  "head, every task) inside (0.05, 0.95), " + _FT,
          rule=wilson_rule("tests (p-values)"), interval="wilson",
          note="fewer analysed sequences than the paper's 1,000 widen each test and move p-values "
               "into the band: a run with fewer sequences reads high"),
    Claim("average_vs_test", PANDE, "averages assign roles that the test does not (Fig. 2)",
          None, "text", None, "finetuned", "tasks",
          "section \"Hypothesis testing\" (Fig. 2); section \"Related work\"",
          quote="For instance, an assertion based on the average being ≥ 3 would assign the "
                "functional role to the head in Figure 2 . However, hypothesis testing to assert "
                "that population mean is more than 3 would fail.",
          measure="(head, role) pairs of the four functional roles whose scores are skewed as "
                  "in Fig. 2: mean sieve bias at least tau + 0.5, median at most tau - 0.5 "
                  "(`FIG2_GAP`: a mean or median within 0.5 of tau is noise at the threshold, "
                  "not Fig. 2's case), and the test does not reject (the average rule assigns, "
                  "the paper's rule does not), summed over the tasks",
          rule="holds when there is at least one such skewed pair", check="average_vs_test",
          note="\"in our experiments we find that averages are inflated by outliers sufficiently "
               "to incorrectly infer functional roles that are not statistically significant\" "
               "(section \"Related work\")"),
)

_PANDE_FIG4 = (
    Claim("share_delimiter", PANDE, "share of delimiter heads, mean over the four tasks", 0.7343,
          "share", "share_delimiter", "finetuned", "mean_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)", printed="73.43%",
          quote="Across tasks, there are significant number of delimiter heads (on average "
                "73.43% across the 4 tasks).",
          measure="heads whose delimiter test rejects (the coarse test, not the union of [CLS] "
                  "and [SEP]), share of all heads, mean over " + _FT,
          rule=wilson_rule(), interval="wilson",
          note="the blog rounds it: \"There are a significant number of Delimiter Heads (73% "
               "across 4 GLUE tasks)\""),
    Claim("share_unskilled", PANDE, "share of heads with no functional role, mean over the tasks",
          0.0937, "share", "share_unskilled", "finetuned", "mean_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)", printed="9.37%",
          quote="There are very few heads which do not perform any functional role (avg. 9.37% "
                "across the 4 tasks).",
          measure="heads none of whose four coarse tests rejects, share of all heads, mean over "
                  + _FT, rule=wilson_rule(), interval="wilson"),
    Claim("share_syntactic_also_local", PANDE, "share of syntactic heads that are also local "
          "(per task 42.1% to 88.8%, mean 70.9%)", 0.709, "share", "share_syntactic_also_local",
          "finetuned", "range_over_tasks",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)",
          value_range=(0.421, 0.888), printed="42.1% to 88.8% (mean 70.9%)",
          quote="More specifically, across the four tasks, 42.1% to 88.8% (with a mean of 70.9%) "
                "of syntactic heads overlap with local heads.",
          measure="per task, heads whose syntactic and local tests both reject over heads whose "
                  "syntactic test rejects; mean over " + _FT,
          rule=wilson_rule("syntactic heads") + " (the mean over the tasks)", interval="wilson",
          note="needs a parse of the task text (syntactic sieve)"),
    *(Claim(f"spearman_{t}", PANDE, f"Spearman correlation of the local and syntactic sieve "
            f"bias, {TASK_NAMES[t]}", v, "corr", "spearman_local_syntactic", "finetuned", "task",
            "section \"Are functional roles mutually exclusive?\" (overlap of local and syntactic)",
            task=t, tasks=(t,), printed=f"{v:.2f}",
            quote="We observe a very high correlation score of 0.78, 0.81, 0.85, 0.73 scores for "
                  "QNLI, QQP, MRPC, SST-2 tasks respectively, with a p-value of 0.",
            measure="Spearman's rho of the local and syntactic sieve bias over every (sequence, "
                    "head) pair where both are defined, the task's fine-tuned model on its own "
                    "analysed sequences, the syntactic sieve from the task text's parse",
            rule="holds when this run's rho is within 0.10 of the paper's", tolerance=0.10)
      for t, v in (("qnli", 0.78), ("qqp", 0.81), ("mrpc", 0.85), ("sst2", 0.73))),
    Claim("nsubj_next_local", PANDE, "nsubj heads overlap highly with next-local heads", None,
          "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\"",
          quote="We observe that nsubj heads have a high overlap with next-loc heads and "
                "dobj-heads have a high overlap with the prev-loc heads.",
          measure="of the model's distinct heads (a head counts once: it has a role when it has "
                  "it in some task), the nsubj heads that are also next_local heads, against the "
                  "next_local heads' base rate",
          rule=_enriched("fine_overlap:nsubj:next_local"),
          check="fine_overlap:nsubj:next_local"),
    Claim("obj_prev_local", PANDE, "dobj heads overlap highly with previous-local heads", None,
          "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\"",
          quote="We observe that nsubj heads have a high overlap with next-loc heads and "
                "dobj-heads have a high overlap with the prev-loc heads.",
          measure="of the model's distinct heads, the obj (dobj) heads that are also prev_local "
                  "heads, against the prev_local heads' base rate",
          rule=_enriched("fine_overlap:obj:prev_local"),
          check="fine_overlap:obj:prev_local"),
    Claim("delimiter_intersect", PANDE, "delimiter heads intersect with the other functional heads",
          None, "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\" (Fig. 4)",
          quote="Also given their high prevalence, they naturally intersect with other "
                "functional heads.",
          measure="of the model's distinct heads, those with any of local, syntactic, block "
                  "that are also delimiter heads, against the delimiter heads' base rate",
          rule=_ENRICHED.format(a="of the other functional", b="delimiter")
          + " (the paper explains the intersection by the delimiter heads' prevalence: at the "
            "base rate the sample cannot tell, and the verdict is undecided)",
          check="delimiter_intersect"),
    Claim("multi_functional", PANDE, "many heads are multi-functional (Fig. 4)", None, "text",
          None, "finetuned", "mean_over_tasks", "Fig. 4 caption",
          quote="The intersection between various sets indicate that many heads are "
                "multi-functional.",
          measure="of the model's distinct heads, those with two or more of the four coarse "
                  "roles (in some task), against the share independent roles at the observed "
                  "rates give",
          rule="holds when more heads have two or more coarse roles than independent roles at "
               "their rates give (\"the intersection between various sets\": one-sided exact "
               "binomial test over the distinct heads, p < 0.05), does not hold when fewer (the "
               "other tail), undecided at this n otherwise; the enrichment is reported",
          check="multi_functional"),
    Claim("block_marginal_overlap", PANDE, "block heads overlap only marginally with syntactic / "
          "local heads", None, "text", None, "finetuned", "pooled",
          "section \"Are functional roles mutually exclusive?\" (role of block heads)",
          tasks=PAIR_TASKS,
          quote="There is only a marginal overlap between block heads and syntactic/local heads "
                "indicating that these specialisations are unique.",
          measure="of the model's distinct heads, the block heads (in some pair task: MRPC, QQP, "
                  "QNLI) that are also local or syntactic heads, against those heads' base rate",
          rule="holds when fewer block heads are local or syntactic heads than the heads' marginal "
               "rates give by chance (\"these specialisations are unique\": one-sided exact "
               "hypergeometric test over the distinct heads, p < 0.05), does not hold when more "
               "(the other tail), undecided at this n otherwise; the enrichment is reported",
          check="block_marginal_overlap"),
    Claim("block_heads_sst2", PANDE, "no block heads on SST-2", 0.0, "count", "block_heads",
          "finetuned", "task", "section \"Are functional roles mutually exclusive?\"",
          task="sst2", tasks=("sst2",), printed="none",
          quote="Note that there are no block heads in the SST-2 task as it is a single sequence "
                "task.",
          measure="heads with the block role on SST-2",
          rule="not computable: the block sieve is not defined for single sentences, so no SST-2 "
               "head can be a block head and the statement holds by construction, whatever the "
               "run", tolerance=0.0, check="block_heads_sst2"),
)

_PANDE_FIG5 = (
    Claim("multi_skilled_middle", PANDE, "more multi-skilled heads in the middle layers (5 to 9) "
          "for MRPC, QNLI and SST-2", None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=("mrpc", "qnli", "sst2"), layers=(("middle", (5, 9)),),
          quote="The number of multi-skilled heads is higher in the middle layers (layers 5 to 9) "
                "for MRPC, QNLI and SST-2 tasks.",
          measure="per task, heads with two or more of the Fig. 5 roles (`FIG5_ROLES`) per layer: "
                  "mean over layers 5-9 against the mean over the other layers",
          rule="holds when the middle layers' mean is higher for every one of these tasks run",
          check="multi_skilled_middle", note=_SCALED),
    Claim("multi_skilled_qqp_early", PANDE, "for QQP, more multi-skilled heads in the initial layers",
          None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qqp", tasks=("qqp",), layers=(("initial", (0, 3)),),
          quote="However, for QQP the number of multi-skilled heads is relatively higher in the "
                "initial layers.",
          measure="QQP: heads with two or more Fig. 5 roles per layer, mean over the initial "
                  "layers (0-3, the paper's \"initial ... sets of 4 layers\") against the mean "
                  "over the other layers",
          rule="holds when the initial layers' mean is higher", check="multi_skilled_qqp_early",
          note=_SCALED),
    Claim("delimiter_all_layers", PANDE, "many delimiter ([SEP] and/or [CLS]) heads in all layers",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          quote="Across tasks we find a large number of delimiter heads ([SEP] and/or [CLS]) "
                "across all layers.",
          measure="per task and layer, heads with cls or sep (the Fig. 5 delimiter roles)",
          rule="holds when in every task every layer but layer 0 (the paper's own exception: "
               "\"the first layer contains very few (if any) delimiter heads\") has at least a "
               "quarter of its heads with cls or sep", check="delimiter_all_layers"),
    Claim("delimiter_only_last_three", PANDE, "delimiter heads are often the only functional heads "
          "in the last three layers", None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("last three", (9, 11)),),
          quote="In fact, such delimiter heads are often the only functional heads in the last "
                "three layers across different tasks.",
          measure="in layers 9-11, heads whose Fig. 5 roles are only cls and/or sep, over heads "
                  "with any Fig. 5 role, the tasks pooled",
          rule="holds when the 95% Wilson interval of that share over the distinct skilled heads "
               "lies above one half, does not hold when it lies below, undecided at this n when "
               "it holds one half",
          check="delimiter_only_last_three", note=_SCALED),
    Claim("delimiter_layer0_few", PANDE, "very few (if any) delimiter heads in the first layer",
          None, "text", None, "finetuned", "mean_over_tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("first", (0, 0)),),
          quote="Interestingly, the first layer contains very few (if any) delimiter heads.",
          measure="layer 0: heads with cls or sep, share of the layer's heads, mean over the tasks",
          rule="holds when the 95% Wilson interval of the share over the layer's heads lies "
               "below 1/6 (2 of BERT-base's 12 heads), does not hold when it lies above, undecided "
               "at this n when it holds 1/6 (with 12 heads even none is undecided: 0 of 12 is 0% to "
               "24%)",
          check="delimiter_layer0_few", note=_SCALED),
    Claim("block_layer0", PANDE, "block heads are prevalent in layer 0 for MRPC, QQP and QNLI",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=PAIR_TASKS, layers=(("zeroth", (0, 0)),),
          quote="For all the tasks which take two sentences as inputs (MRPC, QNLI and QQP) block "
                "heads are prevalent in the zeroth layer.",
          measure="per pair task, block heads per layer",
          rule="holds when, in every pair task run, layer 0 has block heads and no layer has more",
          check="block_layer0", note=_SCALED + "; the blog: \"Block heads are mostly present in "
                                               "the zero-th layer\""),
    Claim("block_layers_1_4", PANDE, "in QNLI and MRPC block heads show up in layers 1 to 4",
          None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          tasks=("qnli", "mrpc"), layers=(("1 to 4", (1, 4)),),
          quote="For example, in both QNLI and MRPC, block heads consistently show up in layers 1 "
                "to 4, in addition to layer 0.",
          measure="per task, block heads in each of layers 1-4, scaled, leaving out the layers "
                  "that stand for BERT-base layer 0 (\"in addition to layer 0\")",
          rule="holds when each of those layers has a block head, in QNLI and in MRPC",
          check="block_layers_1_4", note=_SCALED),
    Claim("block_qqp_first_last", PANDE, "in QQP block heads are in the first and last layer, not "
          "the middle ones", None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qqp", tasks=("qqp",), layers=(("middle", (4, 7)),),
          quote="However, in QQP block heads do not show up in the middle layers but are "
                "prevalent in the first and last layer.",
          measure="QQP: block heads in layer 0, in the last layer and in the middle layers (4-7, "
                  "the paper's middle set of 4 layers)",
          rule="holds when layer 0 and the last layer have block heads and the middle layers none",
          check="block_qqp_first_last", note=_SCALED),
    Claim("block_mrpc_all_layers", PANDE, "in MRPC block heads show up in all layers", None,
          "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="mrpc", tasks=("mrpc",),
          quote="Lastly, for MRPC block heads consistently show up across all layers.",
          measure="MRPC: block heads per layer", rule="holds when every layer has a block head",
          check="block_mrpc_all_layers"),
    Claim("syntactic_every_layer", PANDE, "at least 3 syntactic heads in every layer (very few "
          "exceptions)", None, "text", None, "finetuned", "tasks",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          quote="Across all tasks there are at least 3 syntactic heads (nsubj, dobj, amod and "
                "advmod) for all layers (with very few exceptions).",
          measure="per task and layer, heads with any of nsubj, obj, amod, advmod (the Fig. 5 "
                  "syntactic roles)",
          rule="holds when at most 10% of the (task, layer) pairs have fewer than 3 such heads",
          check="syntactic_every_layer",
          note="the blog: \"There are at least 3 syntactic heads in each layer (except a very few "
               "exceptions)\"; needs a parse of the task text"),
    Claim("syntactic_layers_6_8", PANDE, "syntactic heads are most prevalent in layers 6 to 8",
          None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("6 to 8", (6, 8)),),
          quote="Across tasks, the prevalence of syntactic heads is higher in layers 6 to 8",
          measure="heads with any Fig. 5 syntactic role per layer, summed over the tasks",
          rule="holds when the layer with the most such heads is one of layers 6-8 (scaled)",
          check="syntactic_layers_6_8", note=_SCALED),
    Claim("last_two_few_syntactic", PANDE, "the last two layers have very few syntactic or "
          "multi-functional heads", None, "text", None, "finetuned", "pooled",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          layers=(("last two", (10, 11)),),
          quote="Lastly, across tasks the last two layers have very few syntactic or "
                "multi-functional heads.",
          measure="per layer, heads with a Fig. 5 syntactic role and heads with two or more Fig. 5 "
                  "roles, summed over the tasks: mean per layer in layers 10-11 against the other "
                  "layers",
          rule="holds when, for both counts, the last two layers' mean is at most half the other "
               "layers' mean", check="last_two_few_syntactic", note=_SCALED),
    Claim("qnli_layer7_eight_roles", PANDE, "QNLI: a head in layer 7 performs eight functional "
          "roles", None, "text", None, "finetuned", "task",
          "section \"How are functional roles distributed across layers?\" (Fig. 5)",
          task="qnli", tasks=("qnli",), layers=(("layer 7", (7, 7)),),
          quote="For example, in the first plot in Figure 5 (QNLI), the first head in Layer7 "
                "performs eight different functional roles, whereas the last head in the same "
                "layer performs only one functional role [SEP].",
          measure="QNLI: the largest number of Fig. 5 roles of a head in layer 7 (scaled)",
          rule="holds when a head there has at least eight of the Fig. 5 roles",
          check="qnli_layer7", note=_SCALED),
)

_PANDE_FIG6 = (
    Claim("finetune_delimiter_final_drop", PANDE, "fine-tuning lowers the delimiter bias in the "
          "final layers", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="We observe that in the final layers, there is a decrease in the average "
                "delimiter bias score (i.e., avg. βdelimiter h across all heads in these layers).",
          measure="per task, mean over the heads of the final third of the layers of the "
                  "delimiter sieve bias, fine-tuned minus pre-trained (same sequences), and a "
                  "one-sided t-test of the heads' changes",
          rule="holds when, in more than half of the tasks run, the change is negative and "
               "significant (one-sided t-test over the final-third heads, p < 0.05)",
          check="finetune_final:delimiter:-"),
    Claim("finetune_sep_not_cls", PANDE, "the delimiter drop comes from [SEP]; [CLS] changes little",
          None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="On further investigation, we find that this decrease is mainly due to a lower "
                "attention on the [SEP] but the attention on the [CLS] token does not change much.",
          measure="per task, final third of the layers: the change after fine-tuning of the mean "
                  "attention mass on [SEP] and on [CLS] (the distance features' sep and cls; "
                  "attention, as the sentence says, not sieve biases, whose [SEP] one is divided "
                  "by |SEP| = 2 on pairs)",
          rule="holds when, in more than half of the tasks, the [SEP] mass falls and the [CLS] "
               "mass changes at most half as much (\"does not change much\")",
          check="finetune_sep_not_cls",
          note="the blog: \"As part of fine-tuning, there is a decrease in the attention on SEP "
               "token\""),
    Claim("finetune_block_final_rise", PANDE, "fine-tuning raises the block bias in the final "
          "layers", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          tasks=PAIR_TASKS,
          quote="We also find that there is an increase in the average block bias score (i.e., "
                "avg. βblock h across all heads in these layers).",
          measure="per pair task, mean block sieve bias over the heads of the final third of the "
                  "layers, fine-tuned minus pre-trained, and a one-sided t-test of the heads' "
                  "changes",
          rule="holds when, in more than half of the pair tasks run, the change is positive and "
               "significant (one-sided t-test over the final-third heads, p < 0.05)",
          check="finetune_final:block:+"),
    Claim("finetune_initial_middle_stable", PANDE, "bias scores of the initial and middle layers "
          "change little after fine-tuning", None, "text", None, "change", "tasks",
          "section \"What is the effect of fine-tuning on functional roles\" (Fig. 6)",
          quote="However, we offer a different perspective that bias scores in initial and "
                "middle layers do not change much.",
          measure="mean over the tasks and the four functional roles of |change of the mean sieve "
                  "bias| per layer third (initial, middle, final)",
          rule="holds when the initial and the middle thirds each change at most half as much "
               "as the final third (\"do not change much\")", check="finetune_initial_middle_stable",
          note="conclusion: \"We find that later layers have the largest change in their roles\""),
    Claim("finetune_delimiter_heads_drop", PANDE, "the number of delimiter heads drops after "
          "fine-tuning (later layers)", None, "text", None, "change", "tasks", "Conclusion",
          quote="We find that later layers have the largest change in their roles and "
                "specifically the number of delimiter heads drops sharply indicating "
                "specialization for task-specific roles.",
          measure="per task, heads of the final third of the layers whose delimiter test "
                  "rejects, fine-tuned against pre-trained",
          rule="holds when, in more than half of the tasks run, the fine-tuned model has at least "
               "a third fewer (\"drops sharply\")",
          check="finetune_delimiter_heads_drop"),
)

_PANDE_SETUP = (
    Claim("finetune_at_par", PANDE, "the fine-tuned models score at par with Devlin et al.'s "
          "BERT-base", None, "text", None, "finetuned", "tasks", "section \"Experimental Setup\"",
          quote="The performance of the fine-tuned model on these four GLUE tasks is at par with "
                "the one reported in Devlin et al. (BERTBASE) and suitable for further analysis.",
          measure="per task, the best dev score of the fine-tuning grid against Devlin et al.'s "
                  "BERT-base dev score (`DEVLIN_DEV`; none for QQP)",
          rule="holds when every task with a published dev score is within 5 percentage points "
               "of it", check="finetune_at_par"),
)

_BLOG = (
    Claim("blog_cls_initial", BLOG, "[CLS] heads are in the initial layers", None, "text", None,
          "finetuned", "pooled", "section \"2. How are functional roles distributed across layers?\"",
          quote="Heads attending to the CLS token are in the initial layers.",
          measure="heads with the cls role in the first and in the second half of the layers, "
                  "summed over the tasks",
          rule="holds when the first half has more", check="half:cls:first"),
    Claim("blog_sep_later", BLOG, "[SEP] heads are in the later layers", None, "text", None,
          "finetuned", "pooled", "section \"2. How are functional roles distributed across layers?\"",
          quote="Delimiter heads (attending to SEP) are in the later layers.",
          measure="heads with the sep role in the first and in the second half of the layers, "
                  "summed over the tasks",
          rule="holds when the second half has more", check="half:sep:second"),
)

# The paper's settings the reproduction follows (the report's "setup" table), each from
# pande2021_heads_hypothesis.txt, section "Experimental Setup".
PANDE_SETUP = {
    "model": "BERT-base (12 layers x 12 heads), pre-trained on English Wikipedia + Project "
             "Gutenberg (\"We pre-train the BERTBASE model using the English Wikipedia corpus "
             "and a subset of of the Project Gutenberg corpus\")",
    "pre-training": "about 300K steps at sequence length 128 and 1K steps at 512, \"a batch size "
                    "of 2K tokens\" (said of pre-training), one Cloud TPU v3-8",
    "fine-tuning grid": "\"batch sizes chosen among {32, 128} and learning rates among {1e-4, "
                        "2e-4}. Warm-up was set to 10K steps and LAMB optimizer was used\"",
    "analysed model": "each task's fine-tuned model (\"For each task, we feed all the input "
                      "sequences to the fine-tuned BERTBASE model\")",
    "analysed sequences": "\"We use 1000 input sequences (num sents) from the standard test sets "
                          "of the 4 GLUE tasks\"",
    "parser": "\"We use open-source library spaCy for dependency parsing.\"",
    "test": "one-sided test of the mean sieve bias > tau, tau = 3, \"the null hypothesis is "
            "rejected if the p-value is smaller than 0.05\"; the four functional roles tested "
            "independently",
}



CLAIMS: tuple[Claim, ...] = (_PANDE_FIG3 + _PANDE_FIG4 + _PANDE_FIG5 + _PANDE_FIG6 + _PANDE_SETUP
                             + _BLOG)
