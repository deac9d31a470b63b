"""The checks of Pande et al.'s statements (`heads_jax.hoststats.claims.pande`): each takes
(claim, run, model state) and returns (value, holds, detail), or raises `NotComputable` with the
reason. DESIGN.md section 3 ("Verdicts") lists the rules.
"""

from __future__ import annotations

import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.hoststats import roles as roles_lib
from heads_jax.hoststats.claims import bars
from heads_jax.hoststats.claims.claim import (
    FIG2_GAP, FIG5_DELIMITER, FIG5_ROLES, FIG5_SYNTACTIC, PAPER_ROLES, TASK_NAMES, pct)
from heads_jax.hoststats.claims.devlin import devlin_dev
from heads_jax.hoststats.claims.run import (
    Analysis, NotComputable, bert_base_layers, change_pairs, claim_layers, need, scaled_note,
    task_analyses)

def _fig5_syntactic(a: Analysis) -> np.ndarray:
  return need(a.any_of(FIG5_SYNTACTIC), "the syntactic relations (no parse of the task text)")


def _multi_skilled(a: Analysis) -> np.ndarray:
  return need(a.count_of(FIG5_ROLES), "the Fig. 5 roles") >= 2


def _average_vs_test(c, run, state):
  skewed = flat = m = 0
  for a in task_analyses(run, c, state).values():
    if a.medians is None:
      raise NotComputable("needs each head's median sieve bias (the analyses' scores)")
    idx = [a.roles.index(r) for r in PAPER_ROLES if r in a.roles]
    means, medians, assigned = a.means[..., idx], a.medians[..., idx], a.assigned[..., idx]
    high = np.nan_to_num(means, nan=-np.inf) >= a.tau + FIG2_GAP
    low = np.nan_to_num(medians, nan=np.inf) <= a.tau - FIG2_GAP
    skewed += int((high & low & ~assigned).sum())
    flat += int((high & ~low & ~assigned).sum())
    m += int(high.sum())
  return skewed, skewed > 0, (f"{skewed} (task, head, role) means at least tau + {FIG2_GAP:g} "
                              f"with the median at most tau - {FIG2_GAP:g} and no significant "
                              f"test (Fig. 2's skew); {flat} more not significant with the "
                              f"median above tau - {FIG2_GAP:g}; of {m} means at least "
                              f"tau + {FIG2_GAP:g}")


def _overlap_table(c, run, state, first, second):
  """(k, n_a, n_b, n): of the model's n distinct heads, n_a are ``first`` heads and n_b
  ``second`` heads in some task of the claim, k of them both (`bars.union`); None per side when
  no task tested it."""
  per = task_analyses(run, c, state)
  firsts = [first(a) for a in per.values()]
  seconds = [second(a) for a in per.values()]
  pairs = [(x, y) for x, y in zip(firsts, seconds) if x is not None and y is not None]
  if not pairs:
    return None
  x, y = bars.union(p[0] for p in pairs), bars.union(p[1] for p in pairs)
  return int((x & y).sum()), int(x.sum()), int(y.sum()), int(x.size)


def _overlap_result(table, what: str, enriched: bool = True):
  k, n_a, n_b, n = table
  verdict, enrichment, words = bars.overlap_verdict(k, n_a, n_b, n, enriched)
  return (f"{pct(k / n_a)} ({enrichment:.1f}x chance)", verdict,
          f"{k} of {n_a} {what}; {words}")


def _fine_overlap(c, run, state, first, second):
  table = _overlap_table(c, run, state, lambda a: a.role(first), lambda a: a.role(second))
  if table is None or table[1] == 0:
    raise NotComputable(f"no {first} heads" + ("" if any(first in a.roles for a in
                                                        task_analyses(run, c, state).values())
                                              else " (not tested: no parse of the task text)"))
  return _overlap_result(table, f"{first} heads are {second} heads")


def _coarse_role(name):
  def role(a):
    coarse, names = a.coarse()
    return coarse[..., names.index(name)] if name in names else None
  return role


def _other_coarse(a):
  coarse, names = a.coarse()
  if vocab.COARSE_DELIMITER not in names:
    return None
  return coarse[..., [i for i, n in enumerate(names) if n != vocab.COARSE_DELIMITER]].any(-1)


def _delimiter_intersect(c, run, state):
  table = _overlap_table(c, run, state, _other_coarse, _coarse_role(vocab.COARSE_DELIMITER))
  if table is None or table[1] == 0:
    raise NotComputable("no head with another coarse role")
  return _overlap_result(table, "heads with another coarse role are delimiter heads")


def _multi_functional(c, run, state):
  per = task_analyses(run, c, state)
  roles = bars.union(a.coarse()[0] for a in per.values())
  verdict, enrichment, words = bars.multi_verdict(roles.reshape(-1, roles.shape[-1]))
  share = float((roles.sum(-1) >= 2).mean())
  return f"{pct(share)} ({enrichment:.1f}x chance)", verdict, (
      "heads with two or more coarse roles in some task of " + ", ".join(
          TASK_NAMES[t] for t in per) + f": {words}")


def _block_marginal(c, run, state):
  table = _overlap_table(c, run, state, lambda a: a.role(vocab.COARSE_BLOCK),
                         lambda a: a.any_of((vocab.COARSE_LOCAL, vocab.COARSE_SYNTACTIC)))
  if table is None or table[1] == 0:
    raise NotComputable("no block heads in the pair tasks")
  return _overlap_result(table, "block heads are local or syntactic heads", enriched=False)


def _per_layer_mean(counts: np.ndarray, layers) -> float:
  layers = list(layers)
  return float(counts[layers].mean()) if layers else float("nan")


def _multi_skilled_in(c, a, name: str):
  """Multi-skilled heads per layer of analysis ``a``: ``(layers, mean over the claim's layer range
  ``name``, mean over the other layers)``; NotComputable when the model's layers do not separate
  them."""
  per_layer = _multi_skilled(a).sum(1)
  inside = claim_layers(c, name, a.num_layers)
  rest = [l for l in range(a.num_layers) if l not in inside]
  if not inside or not rest:
    raise NotComputable(f"{a.num_layers} layers do not separate the {name} layers")
  return inside, _per_layer_mean(per_layer, inside), _per_layer_mean(per_layer, rest)


def _multi_skilled_middle(c, run, state):
  out, ok = [], True
  for t, a in task_analyses(run, c, state).items():
    mid, m, r = _multi_skilled_in(c, a, "middle")
    ok &= m > r
    out.append(f"{TASK_NAMES[t]} {m:.1f} vs {r:.1f}")
  return "; ".join(out), ok, ("multi-skilled heads per layer, middle layers "
                              f"{list(mid)}{scaled_note(a.num_layers)} vs the others: " + "; ".join(out))


def _multi_skilled_qqp_early(c, run, state):
  a = task_analyses(run, c, state)["qqp"]
  init, i, r = _multi_skilled_in(c, a, "initial")
  return f"{i:.1f} vs {r:.1f}", i > r, (f"QQP multi-skilled heads per layer, layers {list(init)}"
                                        f"{scaled_note(a.num_layers)} vs the others")


def _delimiter_all_layers(c, run, state):
  short = []
  for t, a in task_analyses(run, c, state).items():
    share = need(a.any_of(FIG5_DELIMITER), "cls/sep").mean(1)
    short += [f"{TASK_NAMES[t]} layer {l} ({pct(share[l])})" for l in range(1, a.num_layers)
              if share[l] < 0.25]
  return (f"{len(short)} layer(s) below a quarter", not short,
          "layers 1.. with under a quarter cls/sep heads: " + (", ".join(short) or "none"))


def _delimiter_only_last_three(c, run, state):
  only = skilled = 0
  distinct = []
  for a in task_analyses(run, c, state).values():
    layers = list(claim_layers(c, "last three", a.num_layers))
    fig5 = need(a.count_of(FIG5_ROLES), "the Fig. 5 roles")[layers]
    delim = need(a.count_of(FIG5_DELIMITER), "cls/sep")[layers]
    skilled += int((fig5 > 0).sum())
    only += int(((fig5 > 0) & (fig5 == delim)).sum())
    distinct.append(fig5 > 0)
  if skilled == 0:
    raise NotComputable("no skilled head in the last layers")
  n = int(bars.union(distinct).sum())
  verdict, words = bars.share_verdict(only / skilled, n, 0.5, above=True)
  return pct(only / skilled), verdict, (f"{only} of {skilled} skilled (task, head) pairs in "
                                        f"layers {layers}{scaled_note(a.num_layers)}; {words}")


def _delimiter_layer0_few(c, run, state):
  vals = {}
  for t, a in task_analyses(run, c, state).items():
    layers = list(claim_layers(c, "first", a.num_layers))
    if not layers:
      raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 0")
    vals[t] = float(need(a.any_of(FIG5_DELIMITER), "cls/sep")[layers].mean())
  v = float(np.mean(list(vals.values())))
  verdict, words = bars.share_verdict(v, len(layers) * a.assigned.shape[1], 1 / 6, above=False)
  return pct(v), verdict, f"layers {layers}{scaled_note(a.num_layers)}: " + ", ".join(
      f"{TASK_NAMES[t]} {pct(x)}" for t, x in vals.items()) + f"; {words}"


def _block_per_layer(a: Analysis) -> np.ndarray:
  return need(a.role(vocab.COARSE_BLOCK), vocab.COARSE_BLOCK).sum(1)


def _block_layer0(c, run, state):
  ok, out = True, []
  for t, a in task_analyses(run, c, state).items():
    b = _block_per_layer(a)
    first = list(claim_layers(c, "zeroth", a.num_layers))
    if not first:
      raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 0")
    ok &= bool(b[first].max() > 0 and b[first].max() >= b.max())
    out.append(f"{TASK_NAMES[t]} {b.tolist()}")
  return "; ".join(out), ok, "block heads per layer: " + "; ".join(out)


def _block_layers_1_4(c, run, state):
  ok, out = True, []
  for t, a in task_analyses(run, c, state).items():
    b = _block_per_layer(a)
    zeroth = set(bert_base_layers(0, 0, a.num_layers))
    layers = [l for l in claim_layers(c, "1 to 4", a.num_layers) if l not in zeroth]
    if not layers:
      raise NotComputable(f"{a.num_layers} layers leave no layer for BERT-base layers 1-4 "
                          "besides the one standing for layer 0")
    ok &= bool((b[layers] > 0).all())
    out.append(f"{TASK_NAMES[t]} {b.tolist()}")
  return "; ".join(out), ok, (f"block heads per layer (layers {layers}"
                              f"{scaled_note(a.num_layers)}): " + "; ".join(out))


def _block_qqp(c, run, state):
  a = task_analyses(run, c, state)["qqp"]
  b = _block_per_layer(a)
  mid = list(claim_layers(c, "middle", a.num_layers))
  if not mid:
    raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base's middle layers")
  ok = bool(b[0] > 0 and b[-1] > 0 and (b[mid] == 0).all())
  return str(b.tolist()), ok, f"QQP block heads per layer (middle {mid}{scaled_note(a.num_layers)})"


def _block_heads_sst2(c, run, state):
  task_analyses(run, c, state)
  raise NotComputable("holds by construction: the block sieve is not defined for single "
                      "sentences, so no SST-2 head can have the block role")


def _qnli_layer7(c, run, state):
  a = task_analyses(run, c, state)["qnli"]
  layers = list(claim_layers(c, "layer 7", a.num_layers))
  if not layers:
    raise NotComputable(f"{a.num_layers} layers do not resolve BERT-base layer 7")
  count = need(a.count_of(FIG5_ROLES), "the Fig. 5 roles")[layers]
  _fig5_syntactic(a)      # eight roles need the syntactic relations
  most = int(count.max())
  return f"{most} roles", most >= 8, (f"most Fig. 5 roles of a head in layers {layers}"
                                      f"{scaled_note(a.num_layers)}: {most}")


def _block_mrpc_all(c, run, state):
  b = _block_per_layer(task_analyses(run, c, state)["mrpc"])
  return str(b.tolist()), bool((b > 0).all()), "MRPC block heads per layer"


def _syntactic_every_layer(c, run, state):
  pairs, short = 0, []
  for t, a in task_analyses(run, c, state).items():
    per_layer = _fig5_syntactic(a).sum(1)
    pairs += len(per_layer)
    short += [f"{TASK_NAMES[t]} layer {l} ({n})" for l, n in enumerate(per_layer) if n < 3]
  v = len(short) / pairs
  return pct(v), v <= 0.10, (f"{len(short)} of {pairs} (task, layer) pairs under 3: "
                        + (", ".join(short) or "none"))


def _syntactic_layers_6_8(c, run, state):
  total = None
  for a in task_analyses(run, c, state).values():
    n = _fig5_syntactic(a).sum(1)
    total = n if total is None else total + n
  layers = claim_layers(c, "6 to 8", len(total))
  best = int(np.argmax(total))
  return f"layer {best}", best in layers, (f"syntactic heads per layer {total.tolist()}; layers 6-8 are "
                                f"{list(layers)}{scaled_note(len(total))}")


def _last_two_few(c, run, state):
  syn = multi = None
  for a in task_analyses(run, c, state).values():
    s, m = _fig5_syntactic(a).sum(1), _multi_skilled(a).sum(1)
    syn = s if syn is None else syn + s
    multi = m if multi is None else multi + m
  last = list(claim_layers(c, "last two", len(syn)))
  rest = [l for l in range(len(syn)) if l not in last]
  if not last or not rest:
    raise NotComputable(f"{len(syn)} layers do not separate the last two layers")
  pairs = [(_per_layer_mean(x, last), _per_layer_mean(x, rest)) for x in (syn, multi)]
  ok = all(l <= 0.5 * r for l, r in pairs)
  return (f"syntactic {pairs[0][0]:.1f} vs {pairs[0][1]:.1f}; multi-skilled {pairs[1][0]:.1f} vs "
          f"{pairs[1][1]:.1f}"), ok, f"per layer, layers {last}{scaled_note(len(syn))} vs the others"


def _group_means(pair, role: str, group: str):
  """``(before, after)`` mean sieve bias ``[l', h]`` of ``role`` over the layer third ``group``,
  or None when either analysis lacks the role or the model has no such third."""
  before, after = pair
  if role not in before.roles or role not in after.roles:
    return None
  layers = roles_lib.layer_groups(after.num_layers).get(group)
  if layers is None:
    return None
  return (before.means[layers, :, before.roles.index(role)],
          after.means[layers, :, after.roles.index(role)])


def _group_change(pair, role: str, group: str) -> float | None:
  means = _group_means(pair, role, group)
  if means is None:
    return None
  b, a = means
  with np.errstate(invalid="ignore"):
    d = float(np.nanmean(a) - np.nanmean(b)) if np.isfinite(a).any() and np.isfinite(b).any() else None
  return d


def _head_changes(pair, role: str, group: str) -> np.ndarray | None:
  """Per head of a layer third, fine-tuned minus pre-trained mean sieve bias (finite only)."""
  means = _group_means(pair, role, group)
  if means is None:
    return None
  d = (means[1] - means[0]).ravel()
  return d[np.isfinite(d)]


def _finetune_final(c, run, state, role, sign):
  from scipy import stats as sp_stats
  out, good, n = [], 0, 0
  for t, p in change_pairs(c, run).items():
    d = _head_changes(p, role, "final")
    if d is None or d.size < 2:
      continue
    n += 1
    alternative = "less" if sign == "-" else "greater"
    pv = float(sp_stats.ttest_1samp(d, 0.0, alternative=alternative).pvalue) if d.std() > 0 else (
        0.0 if (d.mean() < 0 if sign == "-" else d.mean() > 0) else 1.0)
    ok = (d.mean() < 0 if sign == "-" else d.mean() > 0) and pv < 0.05
    good += ok
    out.append(f"{TASK_NAMES[t]} {d.mean():+.2f} (p = {pv:.2g}{_block_factors(p, role)})")
  if n == 0:
    raise NotComputable(f"{role} not defined in the final layers")
  return (", ".join(out), good > n / 2,
          f"change of the mean {role} sieve bias over the heads of the final third of the layers "
          f"and a one-sided t-test of the {'fall' if sign == '-' else 'rise'}; {good} of {n} "
          "task(s) significant" + ("; beside it the change of block_plain (the block sieve "
                                   "without its entropy factor), the factor (mean block over "
                                   "mean block_plain) before -> after, and the heads' mean row "
                                   "entropy where measured" if role == vocab.COARSE_BLOCK else ""))


def _block_factors(pair, role: str) -> str:
  """For block: "; block_plain +x, entropy factor a -> b[, row entropy +y]": over the final third,
  the change of block_plain and of the factor that turns it into block (block = block_plain x
  row entropy): the heads' mean block over their mean block_plain, before -> after, and the
  heads' mean row entropy's change where measured (measures.npz); "" for another role."""
  if role != vocab.COARSE_BLOCK:
    return ""
  parts = []
  plain_role = vocab.PLAIN_TWINS[role]
  plain = _head_changes(pair, plain_role, "final")
  if plain is not None and plain.size:
    parts.append(f"block_plain {plain.mean():+.2f}")
  block, plains = _group_means(pair, role, "final"), _group_means(pair, plain_role, "final")
  if block is not None and plains is not None:
    with np.errstate(invalid="ignore", divide="ignore"):
      factor = [float(np.nanmean(b) / np.nanmean(p)) for b, p in zip(block, plains)]
    if all(np.isfinite(factor)):
      parts.append(f"entropy factor {factor[0]:.2f} -> {factor[1]:.2f}")
  before, after = pair
  final = roles_lib.layer_groups(after.num_layers).get("final")
  if before.entropy is not None and after.entropy is not None and final is not None:
    parts.append(f"row entropy {float(after.entropy[final].mean() - before.entropy[final].mean()):+.2f}")
  return "".join(f"; {x}" for x in parts)


def _mass_change(pair, feature: str) -> float:
  """Fine-tuned minus pre-trained mean attention mass on ``feature`` (a distance feature: cls,
  sep) over the heads of the final third of the layers."""
  before, after = pair
  if before.features is None or after.features is None:
    raise NotComputable("needs the heads' attention masses (the distance features of the "
                        "clustering) of both models")
  layers = roles_lib.layer_groups(after.num_layers).get("final")
  if layers is None:
    raise NotComputable(f"{after.num_layers} layers have no final third")
  i = vocab.DISTANCE_FEATURES.index(feature)
  return float(after.features[layers, :, i].mean() - before.features[layers, :, i].mean())


def _finetune_sep_not_cls(c, run, state):
  good, out = 0, []
  pairs = change_pairs(c, run)
  for t, p in pairs.items():
    sep, cls = _mass_change(p, "sep"), _mass_change(p, "cls")
    good += sep < 0 and abs(cls) <= 0.5 * abs(sep)
    out.append(f"{TASK_NAMES[t]} sep {sep:+.3f}, cls {cls:+.3f}")
  return "; ".join(out), good > len(pairs) / 2, (
      "change of the mean attention mass on [SEP] and [CLS] over the heads of the final third "
      "of the layers")


def _finetune_stable(c, run, state):
  per = {g: [] for g in ("initial", "middle", "final")}
  for p in change_pairs(c, run).values():
    for g in per:
      for r in PAPER_ROLES:
        d = _group_change(p, r, g)
        if d is not None:
          per[g].append(abs(d))
  if not all(per.values()):
    raise NotComputable("the layer thirds need at least 3 layers")
  m = {g: float(np.mean(v)) for g, v in per.items()}
  return (", ".join(f"{g} {v:.3f}" for g, v in m.items()),
          m["initial"] <= 0.5 * m["final"] and m["middle"] <= 0.5 * m["final"],
          "mean |change| of the four roles' mean sieve bias per layer third; \"change little\": "
          "at most half the final third's")


def _finetune_delimiter_heads(c, run, state):
  good, out = 0, []
  pairs = change_pairs(c, run)
  for t, (b, a) in pairs.items():
    final = roles_lib.layer_groups(a.num_layers).get("final")
    if final is None:
      raise NotComputable(f"{a.num_layers} layers have no final third")
    nb = int(need(b.role(vocab.COARSE_DELIMITER), vocab.COARSE_DELIMITER)[final].sum())
    na = int(need(a.role(vocab.COARSE_DELIMITER), vocab.COARSE_DELIMITER)[final].sum())
    good += nb > 0 and na <= nb * 2 / 3
    out.append(f"{TASK_NAMES[t]} {nb} -> {na}")
  return "; ".join(out), good > len(pairs) / 2, ("delimiter heads of the final third, before -> "
                                                 "after; \"sharply\": at least a third fewer")


def _finetune_at_par(c, run, state):
  out, ok, n = [], True, 0
  for t in c.tasks:
    dev = devlin_dev(t)
    best = run.finetune.get(t)
    if dev is None or dev.value is None or not best or best.get(dev.metric) is None:
      continue
    v = float(best[dev.metric])
    n += 1
    ok &= abs(v - dev.value) <= 0.05
    out.append(f"{TASK_NAMES[t]} {pct(v)} vs {pct(dev.value)}")
  if n == 0:
    raise NotComputable("no task with both a dev score here and a published one")
  return "; ".join(out), ok, "best dev score vs Devlin et al. BERT-base dev (" + "; ".join(out) + ")"


def _half(c, run, state, role, half):
  first = second = 0
  for a in task_analyses(run, c, state).values():
    x = need(a.role(role), role).sum(1)
    mid = a.num_layers // 2
    first += int(x[:mid].sum())
    second += int(x[a.num_layers - mid:].sum())
  ok = first > second if half == "first" else second > first
  return f"{first} vs {second}", ok, f"{role} heads in the first vs the second half of the layers"


# The checks by the name a claim's ``check`` gives (`heads_jax.hoststats.claims.judging`).
WITH_ARGUMENTS = {"fine_overlap": _fine_overlap, "finetune_final": _finetune_final, "half": _half}
EVALUATORS = {
    "average_vs_test": _average_vs_test,
    "delimiter_intersect": _delimiter_intersect,
    "multi_functional": _multi_functional,
    "block_marginal_overlap": _block_marginal,
    "multi_skilled_middle": _multi_skilled_middle,
    "multi_skilled_qqp_early": _multi_skilled_qqp_early,
    "delimiter_all_layers": _delimiter_all_layers,
    "delimiter_only_last_three": _delimiter_only_last_three,
    "delimiter_layer0_few": _delimiter_layer0_few,
    "block_layer0": _block_layer0,
    "block_layers_1_4": _block_layers_1_4,
    "block_qqp_first_last": _block_qqp,
    "block_mrpc_all_layers": _block_mrpc_all,
    "syntactic_every_layer": _syntactic_every_layer,
    "syntactic_layers_6_8": _syntactic_layers_6_8,
    "last_two_few_syntactic": _last_two_few,
    "finetune_sep_not_cls": _finetune_sep_not_cls,
    "finetune_initial_middle_stable": _finetune_stable,
    "finetune_delimiter_heads_drop": _finetune_delimiter_heads,
    "finetune_at_par": _finetune_at_par,
    "block_heads_sst2": _block_heads_sst2,
    "qnli_layer7": _qnli_layer7,
}
