"""Every verdict rule of hoststats/claims/ can fail: for each claim a constructed run on which it
must hold and one on which it must not (issue 31). Guan et al.'s claims are judged in the guan
pipeline's setting (their model); on a GLUE run they are "not comparable", the value shown."""

from math import comb

import numpy as np
import pytest

from heads_jax.data import vocabulary as vocab
from heads_jax.hoststats import claims as paper

ROLES = vocab.ROLES
F = vocab.DISTANCE_FEATURES


def _a(assigned=None, L=6, H=4, means=None, medians=None, clusters=None, stability=None,
       summary=None, features=None, info=None):
  """An Analysis whose heads have the roles ``{role: [(layer, head), ...]}``."""
  a = np.zeros((L, H, len(ROLES)), bool)
  for role, heads in (assigned or {}).items():
    for l, h in heads:
      a[l, h, ROLES.index(role)] = True
  m = np.full(a.shape, 1.0) if means is None else means
  return paper.Analysis(roles=ROLES, assigned=a, means=m, tau=3.0, summary=summary or {},
                        clusters=clusters, stability=stability, medians=medians,
                        features=features, cluster_info=info)


# Classifiers that beat their majority class (the fine-tuning verdicts need one).
TRAINED = {t: {"accuracy": 0.85, "majority": 0.6, "n": 400} for t in paper.TASKS}


def _run(finetuned, pretrained=None, setting="glue", **kw):
  """A run of BERT-base (declared: the rules are tested on small shapes too) whose classifiers
  beat their majority class."""
  kw.setdefault("bert_base", True)
  kw.setdefault("finetune", TRAINED)
  tasks = tuple(dict.fromkeys(list(finetuned) + list(pretrained or {})))
  return paper.RunFigures(tasks=tasks, analyses={"finetuned": finetuned,
                                                 "pretrained": pretrained or {}},
                          setting=setting, **kw)


def _heads(L, H, n, layers=None):
  """The first n heads in (layer, head) order, of ``layers`` if given."""
  return [(l, h) for l in (layers if layers is not None else range(L)) for h in range(H)][:n]


# ------------------------------------------------------------------------------------------------
# the constructed runs, per claim: pairs (holds, does not hold) just either side of the rule's bar
# (issue 41 item 5): a count one either side of a Wilson bound, 7 vs 8 roles, 2 of 12 vs 3 of 12,
# four-task runs for the means over tasks, 6-layer models for the scaled layer rules.

Z = 1.959963984540054


def _wilson(k, n):
  """The 95% Wilson interval of k of n (an implementation of its own, not paper.wilson_interval)."""
  p = k / n
  centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
  half = Z / (1 + Z * Z / n) * np.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
  return centre - half, centre + half


def _bracket(value, n):
  """(k_in, k_out): the largest k of n whose Wilson interval holds ``value`` and the next one."""
  k = max(k for k in range(n + 1) if _wilson(k, n)[0] <= value <= _wilson(k, n)[1])
  assert not _wilson(k + 1, n)[0] <= value <= _wilson(k + 1, n)[1]
  return k, k + 1


def _pooled(**v):
  return lambda: _run({"mrpc": _a()}, pooled={"finetuned": v})


ALL144 = _heads(12, 12, 144)
SPREAD = (-2, 2, -1, 1)          # four tasks' counts around their mean


def _four(make, k):
  """Four tasks whose counts are k + SPREAD (mean k)."""
  return lambda: _run({t: make(k + d) for t, d in zip(TASKS4, SPREAD)})


TASKS4 = paper.TASKS


def _mean_share(value, make, n=144):
  k_in, k_out = _bracket(value, n)
  return (_four(make, k_in), _four(make, k_out))


def _delim(k):
  return _a({"delimiter": ALL144[:k]}, 12, 12)


def _unskilled(k):        # 144 - k heads with the local role, k without any
  return _a({"local": ALL144[k:]}, 12, 12)


def _syn_local(also):     # 40 syntactic heads (the same in every task), ``also`` of them local
  return _a({"syntactic": ALL144[:40], "local": ALL144[:also]}, 12, 12)


def _means_above(mean, median, assigned=False):
  means = np.full((6, 4, len(ROLES)), 1.0)
  medians = np.full_like(means, 1.0)
  means[0, 0, ROLES.index("local")] = mean
  medians[0, 0, ROLES.index("local")] = median
  return lambda: _run({"mrpc": _a({"local": [(0, 0)]} if assigned else {}, means=means,
                                  medians=medians)})


def _tails(k, n, n_b, n_a):
  """(P(X >= k), P(X <= k)) of the hypergeometric overlap X of a random n_a-subset with a fixed
  n_b-subset of n heads, from binomial coefficients (not scipy)."""
  total = comb(n, n_a)
  pmf = [comb(n_b, x) * comb(n - n_b, n_a - x) / total for x in range(min(n_a, n_b) + 1)]
  return sum(pmf[k:]), sum(pmf[:k + 1])


def _binomial_tails(k, n, p):
  pmf = [comb(n, x) * p ** x * (1 - p) ** (n - x) for x in range(n + 1)]
  return sum(pmf[k:]), sum(pmf[:k + 1])


def _edges(tails):
  """(k_below, k_above): the largest k whose lower tail is under 5% and the smallest whose upper
  tail is; the ks between are undecided."""
  ks = range(0, 200)
  below = max(k for k in ks if tails(k) is not None and tails(k)[1] < 0.05)
  above = min(k for k in ks if tails(k) is not None and tails(k)[0] < 0.05)
  return below, above


# Overlaps against their base rate, on 144 distinct heads: 40 A heads, 36 B heads (expected 10).
N_A, N_B = 40, 36
OVERLAP_EDGES = _edges(lambda k: _tails(k, 144, N_B, N_A) if k <= N_A else None)


def _overlap_heads(also):
  """(A heads, B heads) of 144: the first N_A heads are A heads, ``also`` of them B heads."""
  return ALL144[:N_A], ALL144[:also] + ALL144[N_A:N_A + N_B - also]


def _overlap(first, second, also):
  a, b = _overlap_heads(also)
  return lambda: _run({"mrpc": _a({first: a, second: b}, 12, 12)})


def _intersect(also):    # A: local heads, B: delimiter heads
  a, b = _overlap_heads(also)
  return lambda: _run({"mrpc": _a({"local": a, "delimiter": b}, 12, 12)})


def _block_overlap(also):  # A: block heads, B: local heads; two pair tasks, the same heads
  a, b = _overlap_heads(also)
  return lambda: _run({t: _a({"block": a, "local": b}, 12, 12) for t in ("mrpc", "qnli")})


# Multi-functional against independent roles: 36 local and 36 delimiter heads of 144, ``k`` of
# them both: chance is 1/4 * 1/4 of the heads (9 heads).
MULTI_EDGES = _edges(lambda k: _binomial_tails(k, 144, 1 / 16) if k <= 36 else None)


def _multi(k):
  return _a({"local": ALL144[:36], "delimiter": ALL144[:k] + ALL144[36:72 - k]}, 12, 12)


def _layers_of(role, per_layer, L=12, H=12, extra=None):
  """``per_layer[l]`` heads of layer l with ``role`` (a role or a tuple of roles)."""
  roles = role if isinstance(role, tuple) else (role,)
  L = len(per_layer)
  assigned = {r: [] for r in roles}
  for l, k in enumerate(per_layer):
    for r in roles:
      assigned[r] += [(l, h) for h in range(k)]
  for r, hs in (extra or {}).items():
    assigned.setdefault(r, []).extend(hs)
  return _a(assigned, L, H)


MULTI = ("cls", "nsubj")  # two Fig. 5 roles: a multi-skilled head


def _per_task(role, per_task):
  return lambda: _run({t: _layers_of(role, per) for t, per in per_task.items()})


# 6 layers: BERT-base's middle 5-9 are layers 2-4, initial 0-3 are 0-1, last three 4-5,
# layers 1-4 (without layer 0's) 1-2, QQP's middle 4-7 are 2-3, 6-8 are 3-4, the last two 5,
# layer 7 is 3.
MID_UP = [2, 2, 3, 2, 2, 2]         # middle mean 2.33 vs 2.0
MID_EVEN = [2, 2, 2, 2, 2, 2]


def _fig5_syn(per):
  return _layers_of("nsubj", per)


def _fig6(tasks, *, delim_t=None, block_t=None, sep=-0.1, cls=0.02, thirds=(0.1, 0.2, 1.0),
          delim_heads=(21, 14)):
  """Three tasks on a 6 x 12 model. ``delim_t`` / ``block_t``: per task, the t statistic of the
  final-third heads' change (a fixed zero-mean sample scaled: p from the t distribution), signed
  as the claim's direction; ``sep``, ``cls``, ``delim_heads``: per task value or one for all."""
  from scipy import stats
  L, H = 6, 12
  final = [4, 5]
  z = np.tile([-1.5, -0.5, 0.5, 1.5], 6)          # 24 final-third heads, mean 0
  z = z / z.std(ddof=1)
  pre, fin = {}, {}
  for i, t in enumerate(tasks):
    before = np.full((L, H, len(ROLES)), 2.0)
    after = before.copy()
    for g, size in zip(([0, 1], [2, 3], [4, 5]), thirds):
      for r in paper.PAPER_ROLES:
        after[g, :, ROLES.index(r)] += size
    for role, ts, sign in (("delimiter", delim_t, -1), ("block", block_t, 1)):
      if ts is None:
        continue
      tv = ts[i]
      mean = sign * tv / np.sqrt(z.size)        # sd 1: t = mean sqrt(n) / sd
      after[final, :, ROLES.index(role)] = (2.0 + mean + z).reshape(2, H)
    fb, fa = np.full((L, H, 21), 0.05), np.full((L, H, 21), 0.05)
    fa[final, :, F.index("sep")] += sep[i] if isinstance(sep, tuple) else sep
    fa[final, :, F.index("cls")] += cls[i] if isinstance(cls, tuple) else cls
    nb, na = delim_heads[i] if isinstance(delim_heads[0], tuple) else delim_heads
    pre[t] = _a({"delimiter": _heads(L, H, nb, final)}, L, H, means=before, features=fb)
    fin[t] = _a({"delimiter": _heads(L, H, na, final)}, L, H, means=after, features=fa)
  return lambda: _run(fin, pre)


T5 = None


def _t_at(p):
  """The t statistic of 23 degrees of freedom whose one-sided p-value is ``p``."""
  from scipy import stats
  return float(stats.t.isf(p, 23))


PAIR3 = ("mrpc", "qqp", "qnli")


def _at_par(*accs):
  return lambda: _run({"mrpc": _a()}, finetune={
      t: {"accuracy": a, "majority": 0.5, "n": 400} for t, a in zip(("mrpc", "sst2", "qnli"), accs)})


# Guan et al. in Guan's setting (the guan pipeline): the SQuAD model's clustering.
GUAN_COUNTS = {"dense": 38, "diagonal": 37, "dense+vertical": 49, "vertical": 20}   # of 144


def _clusters(counts, L=12, H=12, order=None):
  names = np.concatenate([[n] * k for n, k in counts.items()]).astype(object)
  return names.reshape(L, H)


def _guan(finetuned=None, pretrained=None, setting="guan", **kw):
  return paper.RunFigures(tasks=tuple(dict.fromkeys(list(finetuned or {}) + list(pretrained or {}))),
                          analyses={"finetuned": finetuned or {}, "pretrained": pretrained or {}},
                          setting=setting, **kw)


def _guan_share(name, k):
  """384 heads (Guan's 24 x 16), ``k`` of type ``name``, the rest split among the others."""
  others = [t for t in paper.CLUSTER_TYPES if t != name]
  rest = 384 - k
  counts = {name: k, **{t: rest // 3 + (1 if i < rest % 3 else 0) for i, t in enumerate(others)}}
  return lambda: _guan({"squad": _a(L=24, H=16, clusters=_clusters(counts, 24, 16))})


def _guan_share_pair(name):
  k_in, k_out = _bracket(paper.claim(f"guan_share_{name.replace('+', '_')}").value, 384)
  return (_guan_share(name, k_in), _guan_share(name, k_out))


def _guan_stability(label, v, n=144):
  a = lambda s: _a(L=12, H=12, stability=s)
  if label == "pretrained":
    return lambda: _guan({"squad": a(0.96), "mrpc": a(0.96), "mnli": a(0.96)}, {"squad": a(v)})
  return lambda: _guan({"squad": a(0.96), "mrpc": a(0.96), "mnli": a(0.96), label: a(v)},
                       {"squad": a(0.96)})


def _stability_pair(label, claim_key):
  value = paper.claim(claim_key).value
  k_in, k_out = _bracket(value, 144)
  return (_guan_stability(label, k_in / 144), _guan_stability(label, k_out / 144))


def _type_layers(name, layers, L=6, H=4):
  """A clustering with all four types, ``name``'s heads exactly in ``layers`` (one per entry)."""
  others = [t for t in paper.CLUSTER_TYPES if t != name]
  c = np.empty((L, H), dtype=object)
  for l in range(L):
    c[l] = [others[(l + h) % 3] for h in range(H)]
  used = {}
  for l in layers:
    used[l] = used.get(l, 0) + 1
    c[l, H - used[l]] = name
  return lambda: _guan({"squad": _a(L=L, H=H, clusters=c)})


def _over_95(*values):
  a = lambda s: _a(stability=s)
  return lambda: _guan({"squad": a(values[0]), "mrpc": a(values[1]), "mnli": a(values[2])},
                       {"squad": a(values[3])})


def _stable_3_5(structured):
  rng = np.random.default_rng(0)
  if structured == "three":  # three tight groups: k = 3 stable (100%), k = 5 not (71.5%)
    centres = np.zeros((3, 21))
    for i, f in enumerate((0, 8, F.index("cls"))):
      centres[i, f] = 1.0
    x = np.repeat(centres, [14, 13, 13], 0) + rng.normal(0, 0.002, (40, 21))
  elif structured:           # five tight groups in three well-separated pairs/singles
    centres = np.zeros((5, 21))
    for i, (f, w) in enumerate([(0, 1.0), (0, 0.9), (8, 1.0), (8, 0.9), (F.index("cls"), 1.0)]):
      centres[i, f] = w
      centres[i, F.index("self")] = 1 - w
    x = np.repeat(centres, 8, 0) + rng.normal(0, 0.002, (40, 21))
  else:
    x = rng.dirichlet(np.ones(21), 40)
  x = np.abs(x)
  return lambda: _guan({"squad": _a(L=5, H=8, clusters=np.full((5, 8), "dense", object),
                                    features=x.reshape(5, 8, 21),
                                    info={"method": "kmeans", "seed": 0, "n_init": 4,
                                          "stability_fits": 5})})


def _similar(after_counts, mrpc_counts=None):
  """The SQuAD model before (Guan's counts) and after; an MRPC model (its own data) beside."""
  fin = {"squad": _a(L=12, H=12, clusters=_clusters(after_counts))}
  if mrpc_counts:
    fin["mrpc"] = _a(L=12, H=12, clusters=_clusters(mrpc_counts))
  return lambda: _guan(fin, {"squad": _a(L=12, H=12, clusters=_clusters(GUAN_COUNTS))})


def _similar_pair():
  """Dense 38 of 144 before: the largest after-count inside its Wilson interval, and the next."""
  lo, hi = _wilson(38, 144)
  k_in = max(k for k in range(145) if lo <= k / 144 <= hi)
  def counts(k):            # the other types give up the heads evenly, staying in their intervals
    d = k - 38
    return {"dense": k, "diagonal": 37 - d // 3, "dense+vertical": 49 - d // 3 - d % 3,
            "vertical": 20 - d // 3}
  far = {"dense": 10, "diagonal": 37, "dense+vertical": 77, "vertical": 20}
  return (_similar(counts(k_in), mrpc_counts=far), _similar(counts(k_in + 1)))


def _kept(middle_changed, final_changed=24, L=6, H=12):
  """Guan's four types on 6 x 12 heads before; after, ``final_changed`` heads of the final third
  (layers 4-5) and ``middle_changed`` of the middle (2-3) take another type."""
  counts = {"dense": 18, "diagonal": 18, "dense+vertical": 18, "vertical": 18}
  before = _clusters(counts, L, H)
  after = before.copy()
  flat = after.reshape(-1)
  idx = list(range(48, 48 + final_changed)) + list(range(24, 24 + middle_changed))
  cycle = paper.CLUSTER_TYPES
  for i in idx:                 # each to the next type: every type keeps heads
    flat[i] = cycle[(cycle.index(flat[i]) + 1) % 4]
  return lambda: _guan({"squad": _a(L=L, H=H, clusters=after)},
                       {"squad": _a(L=L, H=H, clusters=before)})


def _squad(rows_em, n=10000):
  rows = {i: {"exact_match": em, "f1": em + 5} for i, em in rows_em.items()}
  return lambda: _guan({}, squad={"rows": rows, "n": n})


PAPER_EM = {i: em for i, _, em, _ in paper.GUAN_TABLE2 + paper.GUAN_TABLE3}


def _em(**changes):
  out = dict(PAPER_EM)
  out.update({int(k[3:]): v for k, v in changes.items()})
  return _squad(out)


def _row_pair(i, n=10000):
  """EM of row i just inside and just outside the Wilson interval around the paper's value (an
  EM e of n questions holds when the paper's value is in e's interval)."""
  target = PAPER_EM[i] / 100
  ks = [k for k in range(n + 1) if _wilson(k, n)[0] <= target <= _wilson(k, n)[1]]
  return (_squad({**PAPER_EM, i: 100 * max(ks) / n}), _squad({**PAPER_EM, i: 100 * (max(ks) + 1) / n}))


def _significance_pair(n=10000):
  """Row 10 just significant and just not (one-sided pooled two-proportion z-test against row 1,
  an implementation of its own), row 8 losing less."""
  from scipy import stats
  base = PAPER_EM[1] / 100

  def p(em):
    pooled = (base + em) / 2
    return stats.norm.sf((base - em) / np.sqrt(pooled * (1 - pooled) * 2 / n))
  ems = [e / 10000 for e in range(7000, 8285)]
  sig = max(e for e in ems if p(e) < 0.05)
  return (_em(row8=82.80, row10=100 * sig), _em(row8=82.80, row10=100 * (sig + 0.0001)))



def _share_edges(n, bar):
  """(k_below, k_above) of n heads: the largest k whose Wilson interval lies below ``bar`` and
  the smallest whose interval lies above it (own implementation, `_wilson`)."""
  return (max(k for k in range(n + 1) if _wilson(k, n)[1] < bar),
          min(k for k in range(n + 1) if _wilson(k, n)[0] > bar))


LAST_THREE_EDGES = _share_edges(36, 0.5)


def _last_three(only):
  """36 skilled heads in layers 9-11 of 12 (all cls), ``only`` of them with cls only."""
  skilled = [(l, h) for l in (9, 10, 11) for h in range(12)]
  return lambda: _run({"mrpc": _a({"cls": skilled, "nsubj": skilled[only:]}, 12, 12)})


LAYER0_EDGES = _share_edges(48, 1 / 6)


def _layer0(k):
  """Layer 0 of 48 heads: k cls heads in each of four tasks."""
  return lambda: _run({t: _layers_of("cls", [k] + [6] * 11, H=48) for t in TASKS4})


# Runs on which a statement judged on a share is undecided at this n: the bar (or the base rate)
# inside the interval, one step inside each edge.
UNDECIDED = {
    "nsubj_next_local": [_overlap("nsubj", "next_local", OVERLAP_EDGES[0] + 1),
                         _overlap("nsubj", "next_local", OVERLAP_EDGES[1] - 1)],
    "delimiter_intersect": [_intersect(OVERLAP_EDGES[1] - 1)],
    "block_marginal_overlap": [_block_overlap(OVERLAP_EDGES[0] + 1)],
    "multi_functional": [lambda: _run({t: _multi(MULTI_EDGES[1] - 1) for t in TASKS4}),
                         lambda: _run({t: _multi(MULTI_EDGES[0] + 1) for t in TASKS4})],
    "delimiter_only_last_three": [_last_three(LAST_THREE_EDGES[0] + 1),
                                  _last_three(LAST_THREE_EDGES[1] - 1)],
    "delimiter_layer0_few": [_layer0(LAYER0_EDGES[0] + 1), _layer0(LAYER0_EDGES[1] - 1),
                             lambda: _run({t: _layers_of("cls", [0] + [6] * 11) for t in TASKS4})],
}


PAIRS = {
    "mean_sieve_score": [(_pooled(mean_sieve_score=3.09), _pooled(mean_sieve_score=3.11)),
                         (_pooled(mean_sieve_score=2.51), _pooled(mean_sieve_score=2.49))],
    "tau": [(_pooled(auto_tau=3.0), _pooled(auto_tau=4.0)), (_pooled(auto_tau=3.0), _pooled(auto_tau=2.0))],
    **{f"spearman_{t}": [(lambda t=t, v=v: _run({t: _a(summary={"spearman_local_syntactic": v - 0.09})}),
                          lambda t=t, v=v: _run({t: _a(summary={"spearman_local_syntactic": v - 0.11})})),
                         (lambda t=t, v=v: _run({t: _a(summary={"spearman_local_syntactic": v + 0.09})}),
                          lambda t=t, v=v: _run({t: _a(summary={"spearman_local_syntactic": v + 0.11})}))]
       for t, v in (("qnli", 0.78), ("qqp", 0.81), ("mrpc", 0.85), ("sst2", 0.73))},
    "share_p_between": [(_pooled(share_p_between=k / 2000, num_p_values=2000),
                         _pooled(share_p_between=(k + 1) / 2000, num_p_values=2000))
                        for k in [_bracket(0.018, 2000)[0]]],
    # four tasks of 144 heads: n = 144 distinct heads, not 576
    "share_delimiter": [_mean_share(0.7343, _delim)],
    "share_unskilled": [_mean_share(0.0937, _unskilled)],
    "share_syntactic_also_local": [_mean_share(0.709, _syn_local, n=40)],
    # Fig. 2: mean >= tau + 0.5 and median <= tau - 0.5, no significant test
    "average_vs_test": [(_means_above(3.5, 2.5), _means_above(3.49, 2.5)),
                        (_means_above(3.5, 2.5), _means_above(3.5, 2.51)),
                        (_means_above(3.5, 2.5), _means_above(3.5, 2.5, assigned=True))],
    # overlaps against their base rate: the first k whose upper exact tail is under 5% holds, the
    # last k whose lower tail is does not (enriched); the block statement the other way round
    "nsubj_next_local": [(_overlap("nsubj", "next_local", OVERLAP_EDGES[1]),
                          _overlap("nsubj", "next_local", OVERLAP_EDGES[0]))],
    "obj_prev_local": [(_overlap("obj", "prev_local", OVERLAP_EDGES[1]),
                        _overlap("obj", "prev_local", OVERLAP_EDGES[0]))],
    "delimiter_intersect": [(_intersect(OVERLAP_EDGES[1]), _intersect(OVERLAP_EDGES[0]))],
    "multi_functional": [(lambda: _run({t: _multi(MULTI_EDGES[1]) for t in TASKS4}),
                          lambda: _run({t: _multi(MULTI_EDGES[0]) for t in TASKS4}))],
    "block_marginal_overlap": [(_block_overlap(OVERLAP_EDGES[0]), _block_overlap(OVERLAP_EDGES[1]))],
    # 6-layer models (scaled): middle layers 2-4 higher in every task vs equal in one
    "multi_skilled_middle": [(_per_task(MULTI, {t: MID_UP for t in ("mrpc", "qnli", "sst2")}),
                              _per_task(MULTI, {"mrpc": MID_UP, "qnli": MID_UP, "sst2": MID_EVEN}))],
    "multi_skilled_qqp_early": [(_per_task(MULTI, {"qqp": [3, 2, 2, 2, 2, 2]}),
                                 _per_task(MULTI, {"qqp": [2, 2, 2, 2, 3, 2]})),
                                (_per_task(MULTI, {"qqp": [3, 2, 2, 2, 2, 2]}),
                                 _per_task(MULTI, {"qqp": [2] * 6}))],
    # every layer but 0 at least a quarter (3 of 12) in every task; layer 0 has none
    "delimiter_all_layers": [(_per_task("cls", {"mrpc": [0] + [3] * 5, "qnli": [0] + [3] * 5}),
                              _per_task("cls", {"mrpc": [0] + [3] * 5, "qnli": [0, 3, 3, 2, 3, 3]}))],
    # last three (layers 9-11 of 12): the Wilson interval of the delimiter-only share over the 36
    # skilled heads above one half (holds) or below it (does not)
    "delimiter_only_last_three": [(_last_three(LAST_THREE_EDGES[1]), _last_three(LAST_THREE_EDGES[0]))],
    # layer 0 of 48 heads: the interval of the mean share below 1/6 (holds) or above it
    "delimiter_layer0_few": [(_layer0(LAYER0_EDGES[0]), _layer0(LAYER0_EDGES[1]))],
    "block_layer0": [(_per_task("block", {t: [3, 3, 1, 0, 0, 0] for t in PAIR3}),
                      _per_task("block", {"mrpc": [3, 3, 1, 0, 0, 0], "qqp": [2, 3, 1, 0, 0, 0],
                                          "qnli": [3, 3, 1, 0, 0, 0]})),
                     (_per_task("block", {t: [1, 0, 0, 0, 0, 0] for t in PAIR3}),
                      _per_task("block", {t: [0] * 6 for t in PAIR3}))],
    # layers 1-2 of 6 (BERT-base 1-4 without the layer standing for 0); layer 0 has none
    "block_layers_1_4": [(_per_task("block", {t: [0, 1, 1, 0, 0, 0] for t in ("mrpc", "qnli")}),
                          _per_task("block", {"mrpc": [0, 1, 1, 0, 0, 0], "qnli": [5, 1, 0, 0, 0, 0]}))],
    "block_qqp_first_last": [(_per_task("block", {"qqp": [1, 0, 0, 0, 0, 1]}),
                              _per_task("block", {"qqp": [1, 0, 1, 0, 0, 1]})),
                             (_per_task("block", {"qqp": [1, 1, 0, 0, 1, 1]}),
                              _per_task("block", {"qqp": [0, 0, 0, 0, 0, 1]})),
                             (_per_task("block", {"qqp": [1, 0, 0, 0, 0, 1]}),
                              _per_task("block", {"qqp": [1, 0, 0, 0, 0, 0]}))],
    "block_mrpc_all_layers": [(_per_task("block", {"mrpc": [1] * 6}),
                               _per_task("block", {"mrpc": [1, 1, 1, 0, 1, 1]}))],
    # at most 10% of (task, layer) pairs under 3: 2 of 24 vs 3 of 24 (a layer with exactly 3 is fine)
    "syntactic_every_layer": [
        (lambda: _run({t: _fig5_syn(p) for t, p in zip(TASKS4, ([3, 2, 3, 3, 3, 3], [3] * 6,
                                                               [3, 3, 3, 3, 2, 3], [3] * 6))}),
         lambda: _run({t: _fig5_syn(p) for t, p in zip(TASKS4, ([3, 2, 3, 3, 3, 3], [3] * 6,
                                                               [3, 3, 3, 3, 2, 3], [2] + [3] * 5))}))],
    # exactly 10%: 1 of 10 (task, layer) pairs under 3 holds, 2 of 10 do not
    "syntactic_every_layer_exact": None,
    "syntactic_layers_6_8": [(lambda: _run({"mrpc": _fig5_syn([3, 3, 3, 4, 3, 3])}),
                              lambda: _run({"mrpc": _fig5_syn([3, 3, 4, 3, 3, 3])})),
                             (lambda: _run({"mrpc": _fig5_syn([3, 3, 3, 3, 4, 3])}),
                              lambda: _run({"mrpc": _fig5_syn([3, 3, 3, 3, 3, 4])}))],
    # the last layer (of 6) at most half the others' mean (4): 2 vs 3
    "last_two_few_syntactic": [(_per_task(MULTI, {"mrpc": [4] * 5 + [2]}),
                                _per_task(MULTI, {"mrpc": [4] * 5 + [3]})),
                               # syntactic fine (2 of 4), multi-skilled (cls + sep) 2 vs 3
                               (lambda: _run({"mrpc": _layers_of("nsubj", [4] * 5 + [2], extra={
                                   "cls": [(l, h) for l in range(5) for h in range(4)] + [(5, 2), (5, 3)],
                                   "sep": [(5, 2), (5, 3)]})}),
                                lambda: _run({"mrpc": _layers_of("nsubj", [4] * 5 + [2], extra={
                                    "cls": [(l, h) for l in range(5) for h in range(4)] + [(5, 2), (5, 3), (5, 4)],
                                    "sep": [(5, 2), (5, 3), (5, 4)]})}))],
    # layer 3 of 6 stands for BERT-base layer 7: eight roles vs seven
    "qnli_layer7_eight_roles": [(lambda: _run({"qnli": _a({r: [(3, 0)] for r in paper.FIG5_ROLES[:8]}, 6, 4)}),
                                 lambda: _run({"qnli": _a({r: [(3, 0)] for r in paper.FIG5_ROLES[:7]}, 6, 4)}))],
    # two of three tasks significant (p just under 0.05) vs one (p just over in the second)
    "finetune_delimiter_final_drop": [
        (_fig6(PAIR3, delim_t=(_t_at(0.049), _t_at(0.049), -3.0)),
         _fig6(PAIR3, delim_t=(_t_at(0.049), _t_at(0.051), -3.0)))],
    "finetune_block_final_rise": [
        (_fig6(PAIR3, block_t=(_t_at(0.049), _t_at(0.049), -3.0)),
         _fig6(PAIR3, block_t=(_t_at(0.049), _t_at(0.051), -3.0)))],
    # [SEP] falls, [CLS] changes at most half as much, in two of three tasks
    "finetune_sep_not_cls": [(_fig6(PAIR3, sep=-0.1, cls=(0.049, -0.049, 0.2)),
                              _fig6(PAIR3, sep=-0.1, cls=(0.049, -0.051, 0.2))),
                             (_fig6(PAIR3, sep=(-0.1, -0.1, 0.1), cls=0.0),
                              _fig6(PAIR3, sep=(-0.1, 0.1, 0.1), cls=0.0))],
    "finetune_initial_middle_stable": [(_fig6(PAIR3, thirds=(0.5, 0.5, 1.0)),
                                        _fig6(PAIR3, thirds=(0.5, 0.51, 1.0))),
                                       (_fig6(PAIR3, thirds=(0.49, 0.49, 1.0)),
                                        _fig6(PAIR3, thirds=(0.51, 0.49, 1.0))),
                                       (_fig6(PAIR3, thirds=(0.49, 0.49, 1.0)),
                                        _fig6(PAIR3, thirds=(0.49, 0.51, 1.0)))],
    # one of two tasks is not more than half
    "finetune_two_tasks": None,
    # "drops sharply": at least a third fewer (21 -> 14) in two of three tasks; 21 -> 15 does not
    "finetune_delimiter_heads_drop": [
        (_fig6(PAIR3, delim_heads=((21, 14), (21, 14), (21, 21))),
         _fig6(PAIR3, delim_heads=((21, 14), (21, 15), (21, 21)))),
        (_fig6(PAIR3, delim_heads=((21, 14), (21, 14), (21, 21))),
         _fig6(PAIR3, delim_heads=((21, 14), (0, 0), (21, 21))))],
    # within 5 points of Devlin et al.'s 86.7 / 92.7 / 88.4, every task
    "finetune_at_par": [(_at_par(0.818, 0.926, 0.884), _at_par(0.816, 0.926, 0.884)),
                        (_at_par(0.916, 0.926, 0.884), _at_par(0.867, 0.926, 0.935))],
    "blog_cls_initial": [(_per_task("cls", {"mrpc": [2, 1, 1, 1, 1, 1]}),
                          _per_task("cls", {"mrpc": [1, 1, 1, 1, 1, 1]}))],
    "blog_sep_later": [(_per_task("sep", {"mrpc": [1, 1, 1, 1, 1, 2]}),
                        _per_task("sep", {"mrpc": [1, 1, 1, 1, 1, 1]}))],
    **{f"guan_share_{n.replace('+', '_')}": [_guan_share_pair(n)] for n in paper.CLUSTER_TYPES},
    # the median layer in the third (6 layers: 0-1, 2-3, 4-5; a median of 1.5 is inside 0-1)
    "guan_layers_dense": [(_type_layers("dense", [1, 2]), _type_layers("dense", [1, 2, 2]))],
    "guan_layers_dense_vertical": [(_type_layers("dense+vertical", [1, 4]),
                                    _type_layers("dense+vertical", [1, 1, 4])),
                                   (_type_layers("dense+vertical", [1, 4]),
                                    _type_layers("dense+vertical", [4, 4, 1]))],
    "guan_layers_vertical": [(_type_layers("vertical", [3, 4]), _type_layers("vertical", [3, 3, 4]))],
    # at least 80% of the layers: 8 of 10 vs 7 of 10
    "guan_layers_diagonal": [(_type_layers("diagonal", range(8), L=10), _type_layers("diagonal", range(7), L=10))],
    "guan_stability_pretrain": [_stability_pair("pretrained", "guan_stability_pretrain")],
    "guan_stability_squad": [_stability_pair("squad", "guan_stability_squad")],
    "guan_stability_mrpc": [_stability_pair("mrpc", "guan_stability_mrpc")],
    "guan_stability_mnli": [_stability_pair("mnli", "guan_stability_mnli")],
    # the mean over the four models at least 95%
    "guan_stability_over_95": [(_over_95(0.9505, 0.94, 0.96, 0.95), _over_95(0.9495, 0.94, 0.96, 0.95)),
                               (_over_95(0.95, 0.95, 0.95, 0.95), _over_95(0.9499, 0.95, 0.95, 0.95))],
    "guan_stable_3_5": [(_stable_3_5(True), _stable_3_5(False)), (_stable_3_5(True), _stable_3_5("three"))],
    "guan_similar_after_finetuning": [_similar_pair()],
    # more than half keep their type (36 of 72 changed: half; 35 holds) and the final third has
    # the most changes; with the most changes in the middle third it fails
    "guan_same_cluster_after_finetuning": [(_kept(11), _kept(12)), (_kept(11), _kept(12, 8))],
    **{f"guan_table{2 if i <= 11 else 3}_row{i}": [_row_pair(i)] for i in PAPER_EM},
    "guan_prune_diagonal": [(_em(row3=8.28), _em(row3=8.29)), (_em(row3=8.28), _em(row3=8.28, row4=0.0)),
                            (_em(row3=0.1 * PAPER_EM[1]), _em(row3=8.28, row2=8.28))],
    "guan_prune_vertical": [(_em(row5=81.36), _em(row5=81.34))],
    "guan_keep_dense_vertical": [(_em(row6=56.88, row7=56.87), _em(row6=56.87, row7=56.87))],
    "guan_uniform_dense": [(_em(row8=72.86), _em(row8=72.84))],
    "guan_uniform_dense_vertical": [_significance_pair(), (_em(row8=9.14, row10=9.13), _em(row8=9.13, row10=9.13))],
    "guan_uniform_vertical": [(_em(row11=50.01), _em(row11=50.0))],
    "guan_diagonal_intra": [(_em(row12=41.42), _em(row12=41.43)), (_em(row13=81.36), _em(row13=81.34))],
    "guan_dense_vertical_inter": [(_em(row19=10.12, row17=10.11), _em(row19=10.11, row17=10.11))],
}
del PAIRS["syntactic_every_layer_exact"], PAIRS["finetune_two_tasks"]
PAIRS["syntactic_every_layer"].append(
    (lambda: _run({"mrpc": _fig5_syn([3] * 9 + [2])}), lambda: _run({"mrpc": _fig5_syn([3] * 8 + [2, 2])})))
PAIR2 = ("mrpc", "qnli")
PAIRS["finetune_delimiter_final_drop"].append(
    (_fig6(PAIR2, delim_t=(_t_at(0.049), _t_at(0.049))), _fig6(PAIR2, delim_t=(_t_at(0.049), -3.0))))
PAIRS["finetune_sep_not_cls"].append(
    (_fig6(PAIR2, sep=-0.1, cls=0.0), _fig6(PAIR2, sep=(-0.1, 0.1), cls=0.0)))
PAIRS["finetune_delimiter_heads_drop"].append(
    (_fig6(PAIR2, delim_heads=(21, 14)), _fig6(PAIR2, delim_heads=((21, 14), (21, 21)))))

# Not a verdict rule: it holds by construction, so the run never judges it.
NEVER_JUDGED = {"block_heads_sst2"}


def test_every_claim_has_a_hold_and_a_fail_run():
  assert set(PAIRS) | NEVER_JUDGED == {c.key for c in paper.CLAIMS}


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_rule_holds_and_fails(key):
  c = paper.claim(key)
  for i, (make_hold, make_fail) in enumerate(PAIRS[key]):
    good, bad = paper.evaluate(c, make_hold()), paper.evaluate(c, make_fail())
    assert good.verdict == paper.HOLDS, (key, i, good.value, good.detail)
    assert bad.verdict == paper.FAILS, (key, i, bad.value, bad.detail)


def test_undecided_where_the_bar_is_inside_the_interval():
  for key, runs in UNDECIDED.items():
    for i, make in enumerate(runs):
      e = paper.evaluate(paper.claim(key), make())
      assert e.verdict == paper.UNDECIDED, (key, i, e.value, e.detail)


def test_the_edges_by_hand():
  """The constructed edges, and the exact tails the verdicts print, from binomial coefficients."""
  # mean 10, sd 2.33 (40 * 1/4 * 3/4 * 104/143): 15 is the first k with P(X >= k) < 5%
  assert OVERLAP_EDGES == (5, 15) and MULTI_EDGES == (4, 15)
  # 24 of 36 = 66.7%: Wilson 50.3% to 79.8%; 2 of 48: 1.2% to 14.0%, 14 of 48: 18.2% to 43.2%
  assert LAST_THREE_EDGES == (12, 24) and LAYER0_EDGES == (2, 14)
  assert _wilson(24, 36)[0] == pytest.approx(0.503, abs=1e-3)
  up, down = _tails(15, 144, 36, 40)
  assert up == pytest.approx(0.0286, abs=5e-4)
  e = paper.evaluate(paper.claim("nsubj_next_local"), _overlap("nsubj", "next_local", 15)())
  assert f"p = {up:.2g} above chance, {down:.2g} below" in e.detail
  assert "enrichment 1.50x" in e.detail and "10.0 expected" in e.detail     # 15 / (40 * 36 / 144)
  # a head counts once over the tasks: two tasks with the same heads are one table
  two = _block_overlap(15)()
  assert "15 of 40 block heads" in paper.evaluate(paper.claim("block_marginal_overlap"), two).detail


def test_block_rise_reports_its_two_factors():
  """Issue 48 item 6: the Fig. 6 block row says how block_plain and the row entropy (block =
  block_plain x entropy) changed beside block: block_plain after - before over the final third,
  the entropy likewise."""
  run = _fig6(("mrpc", "qnli"), block_t=(3.0, 3.0))()
  for t, shift in (("mrpc", 0.0), ("qnli", 0.5)):
    before, after = run.analyses["pretrained"][t], run.analyses["finetuned"][t]
    after.means[4:, :, ROLES.index("block_plain")] += 0.25 + shift     # final third: layers 4, 5
    before.entropy, after.entropy = np.full((6, 12), 1.0), np.full((6, 12), 1.0)
    after.entropy[4:] += 0.3
    after.entropy[:4] -= 5.0                                           # not the final third
  e = paper.evaluate(paper.claim("finetune_block_final_rise"), run)
  # the factor: mean block over mean block_plain over the final third; before fine-tuning both
  # are 2.0 (factor 1), after it block_plain is 2.25 (MRPC) and block the fixture's rise
  before_factor = 1.0
  after_block = float(run.analyses["finetuned"]["mrpc"].means[4:, :, ROLES.index("block")].mean())
  assert f"block_plain +0.25; entropy factor {before_factor:.2f} -> {after_block / 2.25:.2f}; " \
         "row entropy +0.30" in e.value
  assert "block_plain +0.75; entropy factor" in e.value
  assert "the factor (mean block over mean block_plain) before -> after" in e.detail
  # without measures only block_plain is shown; the delimiter row shows neither
  run.analyses["finetuned"]["mrpc"].entropy = None
  assert "row entropy" not in paper.evaluate(paper.claim("finetune_block_final_rise"),
                                             run).value.split("QNLI")[0]
  assert "block_plain" not in paper.evaluate(paper.claim("finetune_delimiter_final_drop"),
                                             _fig6(("mrpc",), delim_t=(3.0,))()).value


def test_low_margin_is_shown_beside_every_verdict_that_reads_the_names():
  """A name within one spread of the next type gates nothing (clustering.py), so the Guan
  verdicts that read the names say which are low margin (clusters.json ``low_margin``)."""
  a = _a(L=12, H=12, clusters=_clusters(GUAN_COUNTS), stability=0.96,
         info={"low_margin": ["dense", "dense+vertical"]})
  b = _a(L=12, H=12, clusters=_clusters(GUAN_COUNTS), stability=0.96, info={"low_margin": []})
  run = _guan({"squad": a}, {"squad": b})
  for key in ("guan_share_dense", "guan_layers_vertical", "guan_similar_after_finetuning",
              "guan_same_cluster_after_finetuning"):
    e = paper.evaluate(paper.claim(key), run)
    assert "low margin (a name within one spread of the next type):" in e.detail, key
    assert "dense, dense+vertical" in e.detail, key
  quiet = _guan({"squad": b}, {"squad": b})
  assert "low margin" not in paper.evaluate(paper.claim("guan_share_dense"), quiet).detail


def test_chance_of_two_roles_by_hand():
  """multi_functional's base rate: P(at least two of independent roles), by hand; the verdict
  prints the enrichment over it."""
  from heads_jax.hoststats.claims import bars
  # 0.2, 0.5, 0.4: none 0.8 * 0.5 * 0.6 = 0.24; one 0.2*0.5*0.6 + 0.8*0.5*0.6 + 0.8*0.5*0.4 = 0.46
  assert bars.multi_rate([0.2, 0.5, 0.4]) == pytest.approx(1 - 0.24 - 0.46)
  assert bars.multi_rate([0.25, 0.25, 0.0, 0.0]) == pytest.approx(1 / 16)
  # 36 local and 36 delimiter heads of 144, 18 of them both: chance 9 heads, enrichment 2x
  e = paper.evaluate(paper.claim("multi_functional"), _run({"mrpc": _multi(18)}))
  assert "18 of 144 heads" in e.detail and "enrichment 2.00x" in e.detail and "9.0 heads" in e.detail


def test_overlaps_without_their_roles_are_not_computable():
  no_delimiter = ("local", "block", "syntactic")
  a = paper.Analysis(roles=no_delimiter, assigned=np.ones((6, 4, 3), bool),
                     means=np.full((6, 4, 3), 5.0), tau=3.0)
  e = paper.evaluate(paper.claim("delimiter_intersect"), _run({"mrpc": a}))
  assert e.verdict == paper.NOT_COMPUTABLE and "another coarse role" in e.detail
  only_delimiter = _a({"delimiter": ALL144[:10]}, 12, 12)
  e = paper.evaluate(paper.claim("delimiter_intersect"), _run({"mrpc": only_delimiter}))
  assert e.verdict == paper.NOT_COMPUTABLE


def test_a_head_named_on_one_side_counts_for_the_types_kept():
  """A head of a named type before that is unnamed after has changed type (it counts); a head
  unnamed on both sides says nothing about the types (left out)."""
  L, H = 6, 4
  names = np.array([["dense", "diagonal", "vertical", "unnamed (closest: dense+vertical, "
                     "margin -0.1)"]] * L, dtype=object)
  after = names.copy()
  after[0, 2] = "unnamed (closest: dense+vertical, margin -0.1)"   # one vertical head loses it
  run = _guan({"squad": _a(L=L, H=H, clusters=after)}, {"squad": _a(L=L, H=H, clusters=names)})
  e = paper.evaluate(paper.claim("guan_same_cluster_after_finetuning"), run)
  # named on some side: 3 heads a layer (the fourth is unnamed on both): 18 heads, 17 kept
  assert "94.4% kept" in e.value


def test_block_heads_on_sst2_are_not_judged():
  e = paper.evaluate(paper.claim("block_heads_sst2"), _run({"sst2": _a()}))
  assert e.verdict == paper.NOT_COMPUTABLE and "single" in e.detail and "construction" in e.detail


def test_guan_on_a_glue_run_is_not_comparable_with_the_value_shown():
  counts = GUAN_COUNTS
  run = _run({"mrpc": _a(L=12, H=12, clusters=_clusters(counts), stability=0.96)})
  for key in ("guan_share_vertical", "guan_layers_diagonal", "guan_stability_mrpc"):
    e = paper.evaluate(paper.claim(key), run)
    assert e.verdict == paper.NOT_COMPARABLE and e.value is not None, key
    assert "BERT-large" in e.detail
  e = paper.evaluate(paper.claim("guan_share_vertical"), run)
  assert e.value == pytest.approx(20 / 144)
  # the guan pipeline on another SQuAD model: statements judged, numbers not comparable
  other = _guan({"squad": _a(L=12, H=12, clusters=_clusters(counts), stability=0.96)},
                setting="guan_other")
  assert paper.evaluate(paper.claim("guan_share_vertical"), other).verdict == paper.NOT_COMPARABLE
  assert paper.evaluate(paper.claim("guan_layers_diagonal"), other).verdict in (paper.HOLDS,
                                                                                paper.FAILS)


def test_wilson_interval_by_hand():
  # 14 of 144 (9.72%): Wilson 95% = (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
  lo, hi = paper.wilson_interval(14 / 144, 144)
  assert lo == pytest.approx(0.05880, abs=1e-4) and hi == pytest.approx(0.15658, abs=1e-4)
  assert paper.wilson_interval(0.0, 10) == (0.0, pytest.approx(0.27753, abs=1e-4))
  assert paper.wilson_interval(0.5, 0) == (0.0, 1.0)
  e = paper.evaluate(paper.claim("share_unskilled"), _run({"mrpc": _unskilled(14)}))
  assert "95% interval over 144: 5.9% to 15.7%" in e.detail


def test_the_papers_own_tables_satisfy_their_statements():
  run = _squad(PAPER_EM)()
  for c in paper.claims(paper.GUAN):
    if c.check.startswith("squad"):
      e = paper.evaluate(c, run)
      assert e.verdict == paper.HOLDS, (c.key, e.detail)


def _few(L, H=1, roles=ROLES, **kw):
  a = np.zeros((L, H, len(roles)), bool)
  return paper.Analysis(roles=roles, assigned=a, means=np.full(a.shape, 2.0), tau=3.0, **kw)


def test_not_computable_where_the_run_cannot_say():
  """The guards of the rules: a model too shallow for a layer range, a role not tested, no
  attention masses, a final third of one head: "not computable here", never a verdict."""
  nc = lambda key, run: paper.evaluate(paper.claim(key), run).verdict == paper.NOT_COMPUTABLE
  one = {t: _few(1) for t in paper.TASKS}
  for key in ("multi_skilled_middle", "multi_skilled_qqp_early", "last_two_few_syntactic"):
    assert nc(key, _run(one)), key
  no_second = ("nsubj", "obj", "block", "delimiter", "cls", "sep")     # no local roles tested
  run = _run({"mrpc": _few(6, 4, no_second), "qnli": _few(6, 4, no_second)})
  run.analyses["finetuned"]["mrpc"].assigned[0, 0, :] = True
  for key in ("nsubj_next_local", "obj_prev_local", "block_marginal_overlap"):
    assert nc(key, run), key
  # Fig. 6: a role not tested, no attention masses, a final third of a single head, 2 layers
  pre = {"mrpc": _few(6, 4, no_second)}
  assert nc("finetune_block_final_rise", _run({"mrpc": _few(6, 4, ("delimiter",))},
                                              {"mrpc": _few(6, 4, ("delimiter",))}))
  assert nc("finetune_sep_not_cls", _run({"mrpc": _few(6, 4)}, {"mrpc": _few(6, 4)}))
  masses = np.full((6, 4, 21), 1 / 21)                  # one model's masses only: still none
  assert nc("finetune_sep_not_cls", _run({"mrpc": _few(6, 4)}, {"mrpc": _few(6, 4, features=masses)}))
  assert nc("finetune_sep_not_cls", _run({"mrpc": _few(6, 4, features=masses)}, {"mrpc": _few(6, 4)}))
  assert nc("finetune_delimiter_final_drop", _run({"mrpc": _few(3, 1)}, {"mrpc": _few(3, 1)}))
  assert nc("finetune_initial_middle_stable", _run({"mrpc": _few(2, 4)}, {"mrpc": _few(2, 4)}))
  # three heads in the final third are enough for the t-test (two are the least)
  for L, H in ((3, 3), (3, 2)):
    after = _few(L, H)
    after.means[-1, :, ROLES.index("delimiter")] = [1.0, 0.9, 0.8][:H]
    e = paper.evaluate(paper.claim("finetune_delimiter_final_drop"), _run({"mrpc": after},
                                                                          {"mrpc": _few(L, H)}))
    assert e.verdict in (paper.HOLDS, paper.FAILS), (L, H, e.detail)
  # a task fine-tuned but not analysed before (or the reverse) is left out, not an error
  run = _run({"mrpc": _few(6, 4), "qnli": _few(6, 4)}, {"mrpc": _few(6, 4), "sst2": _few(6, 4)})
  e = paper.evaluate(paper.claim("finetune_initial_middle_stable"), run)
  assert e.verdict in (paper.HOLDS, paper.FAILS)


def test_bert_base_is_never_judged_by_its_shape():
  """Issue 48 item 6: BERT-base comes from the model's config (``bert_base``), never its shape:
  a 12 x 12 model not declared BERT-base is not comparable, its value shown; declared, judged."""
  for (L, H) in ((12, 12), (12, 6), (6, 12)):
    for declared in (None, False, True):
      run = paper.RunFigures(tasks=("mrpc",), analyses={"finetuned": {"mrpc": _a(L=L, H=H)}},
                             bert_base=declared, model="some-model")
      e = paper.evaluate(paper.claim("share_delimiter"), run)
      assert (e.verdict in (paper.HOLDS, paper.FAILS)) == bool(declared), (L, H, declared)
      if not declared:
        assert e.verdict == paper.NOT_COMPARABLE_MODEL
        # the model in words once: its name, then its shape
        assert f"this run: some-model ({L} layers x {H} heads);" in e.detail
  assert paper.bert_base_layers(0, 0, 5) == ()          # 0.42 of layer 0 of 5: not half
  assert paper.bert_base_layers(0, 1, 5) == (0,)


def test_bert_base_from_the_config(tmp_path):
  """BERT-base: model_type bert with 12 layers, 12 heads, hidden 768, intermediate 3072."""
  import json
  from heads_jax.report import reproduce
  base = {"model_type": "bert", "num_hidden_layers": 12, "num_attention_heads": 12,
          "hidden_size": 768, "intermediate_size": 3072, "vocab_size": 30522}
  cases = {"base": (base, True),
           "narrow": ({**base, "hidden_size": 384, "intermediate_size": 1536}, False),
           "roberta": ({**base, "model_type": "roberta", "vocab_size": 50265}, False),
           "six": ({**base, "num_hidden_layers": 6}, False)}
  for name, (cfg, want) in cases.items():
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    assert reproduce.is_bert_base(tmp_path / name) is want, name
  assert reproduce.is_bert_base(tmp_path / "missing") is False
  assert reproduce.is_bert_base(None) is False


def test_details_say_what_was_measured():
  """The detail names the measure: a range over tasks, a median layer or a count of layers, the
  setting a Guan row was not comparable in; a value that is not a number is not computable."""
  run = _run({t: _syn_local(k) for t, k in zip(TASKS4, (20, 30, 28, 28))})
  assert "range" in paper.evaluate(paper.claim("share_syntactic_also_local"), run).detail
  assert "median layer of the" in paper.evaluate(paper.claim("guan_layers_dense"),
                                                 _type_layers("dense", [1, 2])()).detail
  assert "layers with a diagonal head" in paper.evaluate(
      paper.claim("guan_layers_diagonal"), _type_layers("diagonal", range(8), L=10)()).detail
  glue = _run({"mrpc": _a(L=12, H=12, clusters=_clusters(GUAN_COUNTS))})
  assert "GLUE tasks of its own models" in paper.evaluate(paper.claim("guan_share_dense"), glue).detail
  e = paper.evaluate(paper.claim("mean_sieve_score"), _pooled(mean_sieve_score=float("nan"))())
  assert e.verdict == paper.NOT_COMPUTABLE
  # the stability with 3 and 5 clusters needs the SQuAD model's head features
  no_features = _guan({"squad": _a(L=5, H=8, clusters=np.full((5, 8), "dense", object))})
  e = paper.evaluate(paper.claim("guan_stable_3_5"), no_features)
  assert e.verdict == paper.NOT_COMPUTABLE and "features" in e.detail
