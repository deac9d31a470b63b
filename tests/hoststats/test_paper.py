"""hoststats/claims/: every claim quotes its paper, the values as printed, and the verdict rules
on hand-built analyses."""

import re
from pathlib import Path

import numpy as np
import pytest

from heads_jax.data import vocabulary as vocab
from heads_jax.hoststats import claims as paper
from tests.helpers import skip_unless_ci

PAPERS = Path(__file__).resolve().parents[3] / "shared" / "papers"


def _norm(text: str) -> str:
  """Lower case without whitespace or hyphens (the PDF extraction breaks lines inside words)."""
  return re.sub(r"[\s\-]+", "", text).lower()


def test_every_claim_quotes_a_sentence_of_its_paper():
  if not PAPERS.is_dir():
    skip_unless_ci(f"the papers' text is not beside the checkout: {PAPERS}")
  texts = {p: _norm((PAPERS / f).read_text(encoding="utf-8")) for p, f in paper.PAPER_FILES.items()}
  missing = [c.key for c in paper.CLAIMS if _norm(c.quote) not in texts[c.paper]]
  assert not missing
  # the printed numbers are in the text as printed
  for c in paper.CLAIMS:
    if c.printed and c.paper != paper.GUAN and re.search(r"\d", c.printed):
      for number in re.findall(r"\d+\.\d+%?", c.printed):
        assert _norm(number) in texts[c.paper], (c.key, number)


def test_values_as_printed_and_model_states():
  assert paper.format_paper_value(paper.claim("share_delimiter")) == "73.43%"
  assert paper.format_paper_value(paper.claim("share_unskilled")) == "9.37%"
  assert paper.claim("share_syntactic_also_local").value_range == (0.421, 0.888)
  # Pande et al. analyse each task's fine-tuned model (Figs. 3-5), Fig. 6 the change
  for c in paper.claims(paper.PANDE):
    assert c.model in ("finetuned", "change"), c.key
  assert {c.model for c in paper.claims(paper.PANDE) if c.source.startswith("section \"What is")} \
      == {"change"}
  # Guan et al.: the diagonal share as printed, with the typo explained; 384 heads
  d = paper.claim("guan_share_diagonal")
  assert d.printed == "25.56%" and "26.56%" in d.note and "102 of 384" in d.note
  shares = [paper.claim(f"guan_share_{n}").value for n in ("dense", "diagonal", "dense_vertical",
                                                             "vertical")]
  assert sum(shares) == pytest.approx(0.9899)
  assert round(0.2604 * 384) == 100 and round(0.3411 * 384) == 131 and round(0.1328 * 384) == 51
  for c in paper.claims(paper.GUAN):
    assert "BERT-large" in c.note, c.key                       # the cross-model nature, stated
  assert paper.claim("guan_stability_mrpc").printed == "95.98%"
  assert "16.96" in paper.claim("guan_table3_row12").printed
  assert "19.96%" in paper.claim("guan_table3_row12").note


def test_bert_base_layers_scale_by_depth():
  assert paper.bert_base_layers(6, 8, 12) == (6, 7, 8)
  assert paper.bert_base_layers(6, 8, 6) == (3, 4)
  assert paper.bert_base_layers(9, 11, 6) == (4, 5)
  assert paper.bert_base_layers(10, 11, 6) == (5,)
  assert paper.bert_base_layers(0, 0, 6) == (0,)
  assert paper.bert_base_layers(5, 9, 6) == (2, 3, 4)
  assert paper.bert_base_layers(0, 0, 2) == ()             # too coarse to resolve layer 0
  assert paper.bert_base_layers(0, 11, 24) == tuple(range(24))


ROLES = vocab.ROLES


def _analysis(assigned: dict, num_layers=6, num_heads=4, means=None, clusters=None,
              stability=None, summary=None, medians=None, features=None):
  """An Analysis whose heads have the roles ``{role: [(layer, head), ...]}``."""
  a = np.zeros((num_layers, num_heads, len(ROLES)), bool)
  for role, heads in assigned.items():
    for l, h in heads:
      a[l, h, ROLES.index(role)] = True
  m = np.full(a.shape, 1.0) if means is None else means
  return paper.Analysis(roles=ROLES, assigned=a, means=m, tau=3.0, summary=summary or {},
                        clusters=clusters, stability=stability, medians=medians,
                        features=features)


# Classifiers that beat their majority class (the fine-tuning verdicts need one).
TRAINED = {t: {"accuracy": 0.85, "majority": 0.6, "n": 400} for t in paper.TASKS}


def _run(finetuned: dict, pretrained: dict | None = None, **kw):
  """A run of BERT-base (``bert_base=True`` unless given: the rules are tested on small shapes)
  whose classifiers beat their majority class (unless ``finetune`` is given)."""
  tasks = tuple(finetuned)
  kw.setdefault("bert_base", True)
  kw.setdefault("finetune", TRAINED)
  return paper.RunFigures(tasks=tasks, analyses={"finetuned": finetuned,
                                                 "pretrained": pretrained or {}}, **kw)


def test_numbers_hold_within_their_tolerance():
  c = paper.claim("share_delimiter")
  heads = [(l, h) for l in range(6) for h in range(4)]
  # the share is recomputed from the delimiter test (summary.json's value is not read)
  run = _run({"mrpc": _analysis({"delimiter": heads[:17]}, summary={"share_delimiter": 0.1}),
              "sst2": _analysis({"delimiter": heads[:19], "cls": heads})})
  e = paper.evaluate(c, run)
  assert e.value == pytest.approx(0.75) and e.verdict == paper.HOLDS and "MRPC 70.8%" in e.detail
  run = _run({"mrpc": _analysis({"delimiter": heads[:12]})})
  assert paper.evaluate(c, run).verdict == paper.FAILS               # 23.4 pp off
  assert paper.difference(c, 0.5) == pytest.approx(-23.43)
  assert paper.format_difference(c, paper.difference(c, 0.5)) == "-23.4 pp"
  # a task that was not run, and a claim that needs SQuAD
  e = paper.evaluate(paper.claim("spearman_qnli"), run)
  assert e.verdict == paper.NOT_COMPUTABLE and "QNLI" in e.detail
  assert paper.evaluate(paper.claim("guan_table2_row3"), run).verdict == paper.NOT_COMPUTABLE
  # pooled figures
  run = _run({"mrpc": _analysis({})}, pooled={"finetuned": {"mean_sieve_score": 2.6, "auto_tau": 3.0,
                                                             "share_p_between": 0.05,
                                                             "num_p_values": 500}})
  assert paper.evaluate(paper.claim("mean_sieve_score"), run).verdict == paper.HOLDS
  assert paper.evaluate(paper.claim("tau"), run).verdict == paper.HOLDS
  assert paper.evaluate(paper.claim("share_p_between"), run).verdict == paper.FAILS  # 5% vs 1.8%


def test_layer_statements_by_hand():
  # 6 layers x 4 heads. MRPC: block heads in layers 0 (two), 1, 3; QQP: layers 0 and 5 only.
  mrpc = _analysis({"block": [(0, 0), (0, 1), (1, 0), (3, 2)]})
  qqp = _analysis({"block": [(0, 0), (5, 1)]})
  run = _run({"mrpc": mrpc, "qqp": qqp})
  assert paper.evaluate(paper.claim("block_layer0"), run).verdict == paper.HOLDS
  # layers 1-4 of BERT-base are layers 0, 1, 2 of 6: layer 2 has none
  assert paper.evaluate(paper.claim("block_layers_1_4"), run).verdict == paper.FAILS
  assert paper.evaluate(paper.claim("block_qqp_first_last"), run).verdict == paper.HOLDS
  assert paper.evaluate(paper.claim("block_mrpc_all_layers"), run).verdict == paper.FAILS
  # syntactic heads (Fig. 5 relations): at least 3 per layer in every layer but one of 12 pairs
  syn = {"nsubj": [(l, h) for l in range(6) for h in range(3) if l != 2],
         "amod": [(2, 0), (2, 1)]}
  run = _run({"mrpc": _analysis(syn), "qnli": _analysis(syn)})
  e = paper.evaluate(paper.claim("syntactic_every_layer"), run)
  assert e.verdict == paper.FAILS and "2 of 12" in e.detail        # 2 of 12 pairs > 10%
  # most syntactic heads in layer 3 (BERT-base layers 6-8 are layers 3-4 of 6)
  syn["obj"] = [(3, 3)]
  run = _run({"mrpc": _analysis(syn)})
  e = paper.evaluate(paper.claim("syntactic_layers_6_8"), run)
  assert e.value == "layer 3" and e.verdict == paper.HOLDS and "scaled to 6 layers" in e.detail
  # no parse of the task text: the syntactic relations were not tested
  no_syntax = paper.Analysis(roles=("local", "block", "delimiter", "cls", "sep"),
                             assigned=np.zeros((6, 4, 5), bool), means=np.ones((6, 4, 5)), tau=3.0)
  e = paper.evaluate(paper.claim("syntactic_every_layer"), _run({"mrpc": no_syntax}))
  assert e.verdict == paper.NOT_COMPUTABLE and "parse" in e.detail


def test_fig6_change_by_hand():
  # final third of 6 layers = layers 4, 5; delimiter and sep fall there after fine-tuning, cls not
  before = np.full((6, 4, len(ROLES)), 2.0)
  after = before.copy()
  for r, d in (("delimiter", -1.0), ("sep", -1.5), ("cls", 0.1), ("block", 0.5)):
    after[4:, :, ROLES.index(r)] += d
  fb = np.full((6, 4, 21), 1 / 21)
  fa = fb.copy()
  fa[4:, :, vocab.DISTANCE_FEATURES.index("sep")] -= 0.02     # attention mass on [SEP] falls
  fa[4:, :, vocab.DISTANCE_FEATURES.index("cls")] += 0.005    # on [CLS] it changes little
  pre = {"mrpc": _analysis({"delimiter": [(4, 0), (5, 0)]}, means=before, features=fb)}
  fin = {"mrpc": _analysis({"delimiter": [(4, 0)]}, means=after, features=fa)}
  run = _run(fin, pre)
  for key in ("finetune_delimiter_final_drop", "finetune_sep_not_cls", "finetune_block_final_rise",
              "finetune_initial_middle_stable", "finetune_delimiter_heads_drop"):
    assert paper.evaluate(paper.claim(key), run).verdict == paper.HOLDS, key
  e = paper.evaluate(paper.claim("finetune_delimiter_final_drop"), run)
  assert e.value == "MRPC -1.00 (p = 0)" and e.pretrained is None
  # without the pre-trained analysis: not computable
  e = paper.evaluate(paper.claim("finetune_sep_not_cls"), _run(fin))
  assert e.verdict == paper.NOT_COMPUTABLE


def test_average_rule_against_the_test():
  means = np.full((6, 4, len(ROLES)), 1.0)
  means[0, 0, ROLES.index("local")] = 3.5       # mean above tau, test not rejected
  means[1, 1, ROLES.index("local")] = 4.0       # and a head the test assigns
  means[2, 2, ROLES.index("cls")] = 5.0         # cls is not one of the four roles: not counted
  means[3, 3, ROLES.index("block")] = 3.6       # above tau, not significant, but not skewed
  medians = np.full_like(means, 1.0)
  medians[3, 3, ROLES.index("block")] = 3.05
  medians[2, 2, ROLES.index("cls")] = 1.0
  run = _run({"mrpc": _analysis({"local": [(1, 1)]}, means=means, medians=medians)})
  e = paper.evaluate(paper.claim("average_vs_test"), run)
  assert e.value == 1 and e.verdict == paper.HOLDS and "1 more" in e.detail
  # the gap around tau: a mean within 0.5 of tau, or a median within 0.5 of it, is not Fig. 2's
  for mean, median, n in ((3.5, 2.5, 1), (3.49, 2.5, 0), (3.5, 2.51, 0)):
    means[0, 0, ROLES.index("local")], medians[0, 0, ROLES.index("local")] = mean, median
    run = _run({"mrpc": _analysis({"local": [(1, 1)]}, means=means, medians=medians)})
    assert paper.evaluate(paper.claim("average_vs_test"), run).value == n, (mean, median)
  # without the medians the Fig. 2 claim cannot be judged
  run = _run({"mrpc": _analysis({"local": [(1, 1)]}, means=means)})
  assert paper.evaluate(paper.claim("average_vs_test"), run).verdict == paper.NOT_COMPUTABLE


def test_coarse_claims_read_the_four_tests():
  # a head with cls but not delimiter is no delimiter head for the paper's coarse claims
  run = _run({"mrpc": _analysis({"cls": [(0, 0)], "local": [(0, 0), (1, 1)],
                                 "delimiter": [(1, 1)]})})
  e = paper.evaluate(paper.claim("delimiter_intersect"), run)
  # 1 of the 2 local heads, against 1 delimiter head of 24: P(X >= 1) = 1 - C(23, 2) / C(24, 2)
  # = 1 / 12 (hypergeometric), not below 5%: undecided
  assert e.value.startswith("50.0%") and e.verdict == paper.UNDECIDED
  assert "enrichment 12.00x" in e.detail and "p = 0.083 above chance" in e.detail
  e = paper.evaluate(paper.claim("multi_functional"), run)
  assert e.value.startswith("4.2%")                            # 1 of 24 heads has two coarse roles


def test_every_claim_is_evaluated_without_error():
  rng = np.random.default_rng(0)
  names = np.array(paper.CLUSTER_TYPES, dtype=object)

  def random_analysis():
    a = _analysis({}, clusters=names[rng.integers(0, 4, (6, 4))], stability=0.96,
                  summary={"share_delimiter": 0.7, "share_unskilled": 0.1,
                           "share_syntactic_also_local": 0.6, "spearman_local_syntactic": 0.8})
    a.assigned[:] = rng.random(a.assigned.shape) < 0.3
    a.means[:] = rng.random(a.means.shape) * 5
    a.medians = a.means - 1
    a.features = rng.dirichlet(np.ones(21), (6, 4))
    return a
  tasks = paper.TASKS
  run = _run({t: random_analysis() for t in tasks}, {t: random_analysis() for t in tasks},
             pooled={s: {"mean_sieve_score": 2.7, "auto_tau": 3.0, "share_p_between": 0.02,
                         "num_p_values": 2000} for s in ("finetuned", "pretrained")},
             finetune={t: {"accuracy": 0.9, "majority": 0.5, "n": 200} for t in tasks})
  results = paper.evaluate_all(run)
  assert len(results) == len(paper.CLAIMS)
  for c, e in results:
    assert e.verdict in paper.VERDICTS
    if c.tasks == ("squad",) or c.tasks == ("mnli",) or c.key == "block_heads_sst2":
      assert e.verdict == paper.NOT_COMPUTABLE
    else:
      assert e.verdict != paper.NOT_COMPUTABLE, (c.key, e.detail)
    if c.paper == paper.GUAN and e.verdict != paper.NOT_COMPUTABLE:   # a GLUE run
      assert e.verdict == paper.NOT_COMPARABLE and e.value is not None


def _minilm_run(**kw):
  """A GLUE run of a 6 x 12 model (not BERT-base) with roles on every head."""
  heads = [(l, h) for l in range(6) for h in range(12)]
  a = {t: _analysis({"delimiter": heads[:50], "local": heads[40:60], "nsubj": heads[40:44],
                     "next_local": heads[40:43]}, 6, 12) for t in paper.TASKS}
  return paper.RunFigures(tasks=paper.TASKS, analyses={"finetuned": a, "pretrained": a},
                          model="all-MiniLM-L6-v2", **kw)


def test_pandes_numbers_on_another_model_are_not_comparable():
  """Issue 41 item 3: a number or a layer placement of BERT-base reads "not comparable (other
  model)" on MiniLM, its value shown; statements about the method are judged and say on what."""
  run = _minilm_run(finetune={"mrpc": {"accuracy": 0.86}})
  for key in ("share_delimiter", "spearman_mrpc", "delimiter_all_layers", "finetune_at_par",
              "blog_sep_later", "block_layer0"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict in (paper.NOT_COMPARABLE_MODEL, paper.NOT_COMPUTABLE), key
  e = paper.evaluate(paper.claim("share_delimiter"), run)
  assert e.verdict == paper.NOT_COMPARABLE_MODEL and e.value == pytest.approx(50 / 72)
  assert "6 layers x 12 heads" in e.detail and "all-MiniLM-L6-v2" in e.detail
  assert paper.evaluate(paper.claim("finetune_at_par"), run).verdict == paper.NOT_COMPARABLE_MODEL
  for key in ("delimiter_intersect", "nsubj_next_local", "multi_functional"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict in (paper.HOLDS, paper.FAILS, paper.UNDECIDED), key
    assert e.detail.startswith("a statement about the method, judged on all-MiniLM-L6-v2 (6 layers")
  # the same run declared BERT-base is judged
  e = paper.evaluate(paper.claim("share_delimiter"), _minilm_run(bert_base=True))
  assert e.verdict in (paper.HOLDS, paper.FAILS)


def test_fine_tuning_of_a_constant_classifier_is_not_computable():
  """A classifier that does not beat its majority class with 95% confidence (MRPC: 68.5% accuracy
  on 408 dev pairs, 68.4% of them paraphrases) leaves its task out of the fine-tuning verdicts;
  all tasks out: "not computable (classifier at the majority-class baseline)"."""
  const = {"accuracy": 0.685, "majority": 0.684, "n": 408}
  ok, why = paper.beats_majority(const)
  assert ok is False and "68.4%" in why
  assert paper.beats_majority({"accuracy": 0.74, "majority": 0.684, "n": 408})[0] is True
  # the bar: the one-sided exact binomial test at 5% (k = 294 of 408 vs 0.684: p just under)
  from scipy import stats
  k = next(k for k in range(279, 408)
           if stats.binomtest(k, 408, 0.684, alternative="greater").pvalue < 0.05)
  assert paper.beats_majority({"accuracy": k / 408, "majority": 0.684, "n": 408})[0] is True
  assert paper.beats_majority({"accuracy": (k - 1) / 408, "majority": 0.684, "n": 408})[0] is False
  assert paper.beats_majority({"accuracy": 0.9})[0] is None          # no baseline recorded
  run = _minilm_run(finetune={t: const for t in paper.TASKS})
  for key in ("finetune_delimiter_heads_drop", "finetune_sep_not_cls",
              "guan_same_cluster_after_finetuning"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict == paper.NOT_COMPUTABLE and "majority-class baseline" in e.detail, key


def test_guans_table1_passes_guans_stability_claims():
  """Guan et al.'s Table 1 read by this module's stability (pairs of 10 fits): the printed values
  are not multiples of 1/384 (not "the share identical in all fits") but are pair averages (45
  pairs x 384 heads), and the table passes both stability statements at one bar (95%)."""
  table1 = {"pretrained": 0.9598, "squad": 0.9626, "mrpc": 0.9598, "mnli": 0.9437}
  for v in table1.values():
    assert abs(v * 384 - round(v * 384)) > 0.005 * 384 / 100     # not k / 384 at 2 decimals
    assert abs(v * 384 * 45 - round(v * 384 * 45)) <= 0.00005 * 384 * 45
  run = paper.RunFigures(
      tasks=("squad", "mrpc", "mnli"), setting="guan",
      analyses={"finetuned": {t: _analysis({}, stability=table1[t]) for t in ("squad", "mrpc", "mnli")},
                "pretrained": {"squad": _analysis({}, stability=table1["pretrained"])}})
  e = paper.evaluate(paper.claim("guan_stability_over_95"), run)
  assert e.verdict == paper.HOLDS and e.value == "95.6%"
  assert paper.STABLE_BAR == 0.95 and "95%" in paper.claim("guan_stable_3_5").rule


def test_a_type_whose_definition_is_not_met_gets_no_verdict():
  """Issue 41 item 2: a Guan share, layer or fine-tuning verdict on an unnamed type, and a Table
  2-3 row whose type has no heads, are "not computable (type X: definition not met)"."""
  names = np.array(["dense"] * 6 + ["diagonal"] * 6 + ["unnamed (closest: dense+vertical, margin -0.17)"] * 8
                   + ["vertical"] * 4, dtype=object).reshape(6, 4)
  a = _analysis({}, clusters=names, stability=0.9)
  run = paper.RunFigures(tasks=("squad",), setting="guan", analyses={"finetuned": {"squad": a},
                                                                    "pretrained": {"squad": a}})
  for key in ("guan_share_dense_vertical", "guan_layers_dense_vertical"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict == paper.NOT_COMPUTABLE, key
    assert e.detail.startswith("type dense+vertical: definition not met"), (key, e.detail)
    assert "margin -0.17" in e.detail
  # issue 48 item 6: the fine-tuning comparisons stand on the named types, the unnamed one named
  for key in ("guan_similar_after_finetuning", "guan_same_cluster_after_finetuning"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict == paper.HOLDS, (key, e.detail)
    assert "left out: dense+vertical (pre-trained SQuAD model: definition not met)" in e.detail
    glue = paper.RunFigures(tasks=("mrpc",), analyses={"finetuned": {"mrpc": a},
                                                       "pretrained": {"mrpc": a}},
                            finetune={"mrpc": {"accuracy": 0.9, "majority": 0.5, "n": 400}})
    e = paper.evaluate(paper.claim(key), glue)
    assert e.verdict == paper.NOT_COMPARABLE and "left out: dense+vertical" in e.detail, key
  # no type named in both: not computable, saying which
  other = _analysis({}, clusters=np.full((6, 4), "unnamed (closest: dense, margin -0.1)", object))
  run2 = paper.RunFigures(tasks=("squad",), setting="guan",
                          analyses={"finetuned": {"squad": other}, "pretrained": {"squad": a}})
  e = paper.evaluate(paper.claim("guan_similar_after_finetuning"), run2)
  assert e.verdict == paper.NOT_COMPUTABLE and "no type named in both" in e.detail
  assert paper.evaluate(paper.claim("guan_share_dense"), run).verdict in (paper.HOLDS, paper.FAILS)
  rows = {i: {"exact_match": em, "f1": em, "missing": "dense+vertical" if i in (4, 7, 10) else ""}
          for i, _, em, _ in paper.GUAN_TABLE2 + paper.GUAN_TABLE3}
  run = paper.RunFigures(tasks=(), analyses={}, setting="guan", squad={"rows": rows, "n": 1000})
  for key in ("guan_table2_row4", "guan_keep_dense_vertical", "guan_uniform_dense_vertical"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict == paper.NOT_COMPUTABLE and "type dense+vertical: definition not met" in e.detail
  assert paper.evaluate(paper.claim("guan_table2_row3"), run).verdict == paper.HOLDS


def test_wilson_n_counts_each_head_once_over_tasks():
  """A share averaged over four tasks of a 72-head model is a share of 72 heads, not 288."""
  heads = [(l, h) for l in range(6) for h in range(12)]
  run = _run({t: _analysis({"delimiter": heads[:k]}, 6, 12) for t, k in
              zip(paper.TASKS, (52, 54, 53, 53))})
  e = paper.evaluate(paper.claim("share_delimiter"), run)
  assert "95% interval over 72:" in e.detail
