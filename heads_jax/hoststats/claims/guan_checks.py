"""The checks of Guan et al.'s statements (`heads_jax.hoststats.claims.guan`): the clusters'
layers, stability, fine-tuning, and the SQuAD ablation rows of Tables 2-3. Each takes (claim,
run, model state) and returns (value, holds, detail[, n]), or raises `NotComputable`.
"""

from __future__ import annotations

import math

import numpy as np

from heads_jax.hoststats import roles as roles_lib
from heads_jax.hoststats.claims.claim import ALPHA, STABLE_BAR, TASK_NAMES, pct, wilson_interval
from heads_jax.hoststats.claims.guan import CLUSTER_TYPES, SQUAD_REASON
from heads_jax.hoststats.claims.run import (
    NotComputable, change_pairs, low_margin_note, need_types, task_analyses, unnamed_types)

def _cluster_layers(c, run, state, name, where):
  ok, out = True, []
  per = task_analyses(run, c, state)
  need_types(per, (name,))
  for t, a in per.items():
    num_layers = a.num_layers
    l, _ = np.nonzero(a.clusters == name)
    if where == "all":
      have = len(set(l.tolist()))
      ok &= have / num_layers >= 0.8
      out.append(f"{TASK_NAMES[t]} {have} of {num_layers} layers")
      continue
    if not l.size:
      ok = False
      out.append(f"{TASK_NAMES[t]} no {name} head")
      continue
    median = float(np.median(l))
    third = {"first": 0, "middle": 1, "last": 2}[where]
    bounds = np.array_split(np.arange(num_layers), 3)[third]
    if bounds.size == 0:
      raise NotComputable(f"{num_layers} layers have no {where} third")
    ok &= bool(bounds[0] - 0.5 <= median <= bounds[-1] + 0.5)
    out.append(f"{TASK_NAMES[t]} median layer {median:g} (the {where} third: layers "
               f"{bounds.tolist()})")
  what = ("layers with a " + name + " head" if where == "all" else "median layer of the "
          + name + " heads")
  return "; ".join(out), ok, f"per clustering, {what}: " + "; ".join(out) + low_margin_note(per)


def _stability_over_95(c, run, state):
  vals = [(s, t, a.stability) for s in ("pretrained", "finetuned")
          for t, a in run.analyses.get(s, {}).items() if a.stability is not None]
  if not vals:
    raise NotComputable("no clustering stability in the analyses")
  mean = float(np.mean([v for *_, v in vals]))
  return (pct(mean), mean >= STABLE_BAR,
          f"mean stability over {len(vals)} clustering(s): " + ", ".join(
              f"{s} {TASK_NAMES.get(t, t)} {pct(v)}" for s, t, v in vals))


def _named_in_both(t, before, after) -> tuple[list[str], list[str]]:
  """(types named in both clusterings of task ``t``, the others in words): an unnamed type
  (definition not met) leaves the named types' comparison standing; NotComputable when no type
  is named in both."""
  missing_b, missing_a = unnamed_types(before), unnamed_types(after)
  if missing_b is None or missing_a is None:
    raise NotComputable("no clustering in the analyses")
  named = [n for n in CLUSTER_TYPES if n not in missing_b and n not in missing_a]
  left = [f"{n} ({'pre-trained' if n in missing_b else 'fine-tuned'} {TASK_NAMES.get(t, t)} "
          "model: definition not met)" for n in CLUSTER_TYPES if n not in named]
  if not named:
    raise NotComputable(f"no type named in both clusterings of {TASK_NAMES.get(t, t)}: "
                        + ", ".join(left))
  return named, left


def _pairs_low_margin(pairs) -> str:
  return low_margin_note({f"{TASK_NAMES.get(t, t)} {state}": x for t, (b, a) in pairs.items()
                          for state, x in (("pre-trained", b), ("fine-tuned", a))})


def _left_out(left) -> str:
  return "; left out: " + ", ".join(left) if left else ""


def _cluster_similar(c, run, state):
  ok, out, worst, left = True, [], 0.0, []
  pairs = change_pairs(c, run)
  for t, (b, a) in pairs.items():
    named, gone = _named_in_both(t, b, a)
    left += gone
    n = b.num_heads
    for name in named:
      before, after = float((b.clusters == name).mean()), float((a.clusters == name).mean())
      lo, hi = wilson_interval(before, n)
      inside = lo - 1e-12 <= after <= hi + 1e-12
      ok &= inside
      worst = max(worst, abs(after - before))
      if not inside:
        out.append(f"{TASK_NAMES.get(t, t)} {name} {pct(before)} -> {pct(after)} (interval "
                   f"{pct(lo)} to {pct(hi)})")
  return (f"{100 * worst:.1f} pp largest change", ok,
          "types whose fine-tuned share leaves the 95% interval of the pre-trained share: "
          + (", ".join(out) or "none") + "; tasks " + ", ".join(TASK_NAMES.get(t, t) for t in pairs)
          + _left_out(left) + _pairs_low_margin(pairs))


def _cluster_kept(c, run, state):
  ok, out, left = True, [], []
  changed = {g: [] for g in ("initial", "middle", "final")}
  pairs = change_pairs(c, run)
  for t, (b, a) in pairs.items():
    named, gone = _named_in_both(t, b, a)
    left += gone
    # heads of a named type before or after (a head of an unnamed type on both sides says
    # nothing about the types)
    counted = np.isin(b.clusters, named) | np.isin(a.clusters, named)
    same = (a.clusters == b.clusters) & counted
    ok &= bool(same.sum() > 0.5 * counted.sum())
    out.append(f"{TASK_NAMES[t]} {pct(same.sum() / max(counted.sum(), 1))} kept")
    for g, layers in roles_lib.layer_groups(a.num_layers).items():
      if counted[layers].any():
        changed[g].append(float((~same[layers] & counted[layers]).sum() / counted[layers].sum()))
  share = {g: float(np.mean(v)) for g, v in changed.items() if v}
  if "final" not in share:
    raise NotComputable("the model's layers have no final third")
  ok &= share["final"] >= max(share.values())
  return ("; ".join(out), ok, "changed heads per layer third: "
          + ", ".join(f"{g} {pct(v)}" for g, v in share.items()) + _left_out(left)
          + _pairs_low_margin(pairs))


def _stable_3_5(c, run, state):
  from heads_jax.hoststats import clustering
  a = task_analyses(run, c, state)["squad"]
  if a.features is None or a.clusters is None:
    raise NotComputable("needs the SQuAD model's head features (clusters.csv)")
  info = a.cluster_info or {}
  x = a.features.reshape(-1, a.features.shape[-1])
  method, seed, n_init = info.get("method", "kmeans"), int(info.get("seed", 0)), int(info.get("n_init", 10))
  fits = int(info.get("stability_fits", 10)) or 10
  vals = {}
  for k in (3, 5):
    model, *_ = clustering.fit_types(x, k, method, seed, n_init)
    v = clustering.clustering_stability(x, model.predict(x), k, method, seed, fits, n_init)
    if v is None:
      raise NotComputable(f"{x.shape[0]} heads are too few for {k} clusters on halves")
    vals[k] = v
  return (", ".join(f"k = {k}: {pct(v)}" for k, v in vals.items()),
          all(v >= STABLE_BAR for v in vals.values()),
          f"stability with 3 and 5 clusters ({method}, {fits} half-sample fits)")


def _one_sided_two_proportions(before: float, after: float, n: int) -> float:
  """p-value of a fall from ``before`` to ``after`` (shares of the same ``n`` questions; pooled
  two-proportion z-test, one-sided)."""
  from scipy import stats as sp_stats
  pooled = (before + after) / 2
  se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / n)
  return float(sp_stats.norm.sf((before - after) / se))


def _squad_rows(run) -> dict:
  if not run.squad or not run.squad.get("rows"):
    raise NotComputable(SQUAD_REASON)
  return run.squad["rows"]


def _squad_row(c, run, state, row):
  rows = _squad_rows(run)
  r = rows.get(int(row))
  if r is None:
    raise NotComputable(f"the run's Tables 2-3 have no row {row}")
  if r.get("missing"):
    raise NotComputable(f"type {str(r['missing']).split(',')[0].strip()}: definition not met "
                        "(the row's heads could not be chosen)")
  n = run.squad.get("n")
  return (float(r["exact_match"]), None,
          f"EM {r['exact_match']:.2f} / F1 {r['f1']:.2f} on {n} questions", n)


def _squad_statement(c, run, state, key):
  rows = _squad_rows(run)
  em = {i: float(r["exact_match"]) for i, r in rows.items()}
  rows_of = {"guan_prune_diagonal": (1, 2, 3, 4, 5), "guan_prune_vertical": (1, 5),
             "guan_keep_dense_vertical": (6, 7), "guan_uniform_dense": (1, 8),
             "guan_uniform_dense_vertical": (1, 8, 10), "guan_uniform_vertical": (11,),
             "guan_diagonal_intra": (1, 12, 13), "guan_dense_vertical_inter": (17, 19)}[key]
  missing = [i for i in rows_of if i not in em]
  if missing:
    raise NotComputable(f"the run's Tables 2-3 lack rows {missing}")
  unnamed = [str(rows[i].get("missing")) for i in rows_of if rows[i].get("missing")]
  if unnamed:
    raise NotComputable(f"type {unnamed[0].split(',')[0].strip()}: definition not met (the "
                        "rows' heads could not be chosen)")
  loss = {i: em[1] - em[i] for i in em} if 1 in em else {}
  if key == "guan_prune_diagonal":
    ok = em[3] <= 0.1 * em[1] and all(loss[3] > loss[i] for i in (2, 4, 5))
    value = (f"row 3 {em[3]:.2f} of row 1 {em[1]:.2f}; loss {loss[3]:.2f} vs "
             f"{max(loss[i] for i in (2, 4, 5)):.2f}")
  elif key == "guan_prune_vertical":
    ok, value = loss[5] < 1.5, f"loss {loss[5]:.2f}"
  elif key == "guan_keep_dense_vertical":
    ok, value = em[6] > em[7], f"row 6 {em[6]:.2f} vs row 7 {em[7]:.2f}"
  elif key == "guan_uniform_dense":
    ok, value = loss[8] < 10, f"loss {loss[8]:.2f}"
  elif key == "guan_uniform_dense_vertical":
    n = run.squad.get("n")
    if not n:
      raise NotComputable("\"significant\" needs the number of evaluated questions")
    p = _one_sided_two_proportions(em[1] / 100, em[10] / 100, int(n))
    ok = p < ALPHA and loss[10] > loss[8]
    value = f"loss {loss[10]:.2f} (p = {p:.2g}) vs {loss[8]:.2f}"
  elif key == "guan_uniform_vertical":
    ok, value = em[11] > 50, f"EM {em[11]:.2f}"
  elif key == "guan_diagonal_intra":
    ok = em[12] <= 0.5 * em[1] and loss[13] < 1.5
    value = f"row 12 {em[12]:.2f} of row 1 {em[1]:.2f}; row 13 loses {loss[13]:.2f}"
  else:
    ok, value = em[19] > em[17], f"row 19 {em[19]:.2f} vs row 17 {em[17]:.2f}"
  return value, ok, "EM (percent) of the rows " + ", ".join(f"{i}: {em[i]:.2f}" for i in rows_of)


# The checks by the name a claim's ``check`` gives (`heads_jax.hoststats.claims.judging`).
WITH_ARGUMENTS = {"cluster_layers": _cluster_layers, "squad_row": _squad_row,
                  "squad_statement": _squad_statement}
EVALUATORS = {
    "stability_over_95": _stability_over_95,
    "cluster_similar": _cluster_similar,
    "cluster_kept": _cluster_kept,
    "stable_3_5": _stable_3_5,
}
