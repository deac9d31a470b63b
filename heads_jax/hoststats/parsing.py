"""Heads as dependency parsers (Clark et al. 2019, section 4): accuracy per relation and direction,
fixed-offset baselines, bootstrap intervals over sentences, and agreement with the sieve's
syntactic roles (host, numpy / pandas; no jax).

Input: each head's predicted word per word, ``pred`` int ``[N, l, h, w]`` (``parse_pred`` of
``heads_jax.stats.norms``; -1 for a word with no piece), and the gold (or parser) arcs of the
N sequences as a table with columns ``sequence``, ``dependent``, ``head`` (word indices in the
sequence's numbering: segment B continues after A, as ``word_ids``) and ``relation`` (the label
as the data spells it; UD subtypes such as ``nsubj:pass`` are their own relation, as the sieves).

* direction ``dep2head``: the dependent's prediction is its head word, ``pred[dep] == head``;
  ``head2dep``: the head word's prediction is the dependent, ``pred[head] == dep``.
* An arc counts when both of its words are in the encoded sequence (truncation drops words).
* Baseline: the word at a fixed offset (``head = dep + offset`` for ``dep2head``,
  ``dep = head + offset`` for ``head2dep``), for each offset in ``OFFSETS``; the best offset per
  relation and direction is the baseline to beat (Clark et al. Table 1 compares each relation's
  best head with the best fixed offset).
* Interval: percentile bootstrap over sentences (sequences resampled with replacement, accuracy
  = correct / arcs of the resample), ``confidence`` 0.95 by default.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from heads_jax import contract
from heads_jax.data import vocabulary
from heads_jax.errors import UserError

DIRECTIONS = ("dep2head", "head2dep")
# the registry's one-relation roles, in its order: nsubj, obj, amod, advmod
DEFAULT_RELATIONS = tuple(r.name for r in vocabulary.REGISTRY
                          if r.sieve == vocabulary.SIEVE_RELATION and len(r.relations) == 1)
MIN_ARCS = 100
OFFSETS = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)
PARSER_COLUMNS = contract.PARSER_COLUMNS
ARC_COLUMNS = ("sequence", "dependent", "head", "relation")


def example_arcs(example, sequence: int) -> list[tuple]:
  """The arcs ``(sequence, dependent, head, relation)`` of one ``AnalysisExample`` (segments
  with ``heads`` and ``deprels``), words numbered over the sequence (B after A); roots skipped."""
  rows, offset = [], 0
  for seg in (example.a, example.b):
    if seg is None:
      continue
    if seg.heads is not None:
      for dep, (head, rel) in enumerate(zip(seg.heads, seg.deprels)):
        if head is not None and int(head) >= 0:
          rows.append((sequence, dep + offset, int(head) + offset, str(rel)))
    offset += seg.num_words or 0
  return rows


def arcs_table(examples) -> pd.DataFrame:
  """``ARC_COLUMNS`` for examples in dataset order (sequence = position)."""
  rows = [r for i, ex in enumerate(examples) for r in example_arcs(ex, i)]
  return pd.DataFrame(rows, columns=list(ARC_COLUMNS))


def _check(pred, arcs: pd.DataFrame) -> np.ndarray:
  pred = np.asarray(pred)
  if pred.ndim != 4:
    raise ValueError(f"pred must be [N, l, h, w], got shape {pred.shape}")
  missing = [c for c in ARC_COLUMNS if c not in arcs.columns]
  if missing:
    raise ValueError(f"the arcs table lacks columns {missing} (has {list(arcs.columns)})")
  if len(arcs) and (arcs["sequence"].max() >= pred.shape[0] or arcs["sequence"].min() < 0):
    raise ValueError(f"the arcs name sequences up to {arcs['sequence'].max()}, but pred has "
                     f"{pred.shape[0]}")
  return pred


def evaluable_arcs(pred, arcs: pd.DataFrame) -> pd.DataFrame:
  """The arcs whose two words are both in the encoded sequence (predicted at all), with integer
  columns; the presence of a word is the same for every head (``pred[..., 0, 0, w] != -1``)."""
  pred = _check(pred, arcs)
  w = pred.shape[-1]
  a = arcs.reset_index(drop=True)
  seq, dep, head = (a[c].to_numpy(np.int64) for c in ("sequence", "dependent", "head"))
  inside = (dep < w) & (head < w) & (dep >= 0) & (head >= 0)
  present = np.zeros(len(a), bool)
  present[inside] = ((pred[seq[inside], 0, 0, dep[inside]] >= 0)
                     & (pred[seq[inside], 0, 0, head[inside]] >= 0))
  return a[present].reset_index(drop=True)


def _bootstrap(correct_seq, n_seq, rounds: int, rng, confidence: float):
  """Percentile interval of sum(correct) / sum(n) over sequences resampled with replacement:
  ``correct_seq`` ``[S, m]``, ``n_seq`` ``[S]`` -> (low, high) ``[m]``."""
  s = len(n_seq)
  if rounds <= 0 or s == 0:
    nan = np.full(correct_seq.shape[1], np.nan)
    return nan, nan
  counts = rng.multinomial(s, np.full(s, 1.0 / s), size=rounds).astype(np.float64)  # [B, S]
  total = counts @ n_seq
  with np.errstate(invalid="ignore", divide="ignore"):
    acc = (counts @ correct_seq) / total[:, None]
  tail = (1.0 - confidence) / 2 * 100
  low, high = np.nanpercentile(acc, [tail, 100 - tail], axis=0)
  return low, high


def relations_to_score(arcs: pd.DataFrame, relations: Sequence[str] = DEFAULT_RELATIONS,
                       min_arcs: int = MIN_ARCS) -> list[str]:
  """``relations`` (always) then every other relation with at least ``min_arcs`` arcs, by count."""
  counts = arcs["relation"].value_counts()
  extra = [r for r, c in counts.items() if c >= min_arcs and r not in relations]
  return list(relations) + extra


def parsing_table(pred, arcs: pd.DataFrame, *, relations: Sequence[str] = DEFAULT_RELATIONS,
                  min_arcs: int = MIN_ARCS, offsets: Sequence[int] = OFFSETS,
                  bootstrap: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
  """Accuracy of every head and every fixed offset per relation and direction (``parser.csv``).

  Args:
    pred: int ``[N, l, h, w]`` predicted word per word (-1: no piece).
    arcs: ``ARC_COLUMNS`` (``arcs_table``).
    relations: always scored; plus every relation with ``min_arcs`` evaluable arcs.
    offsets: the fixed-offset baselines.
    bootstrap: resamples of the sentences for the interval (0: no interval).

  Returns:
    ``PARSER_COLUMNS``: one row per (relation, direction, head) with ``kind`` = "head" (offset
    NaN), and per (relation, direction, offset) with ``kind`` = "offset" (layer, head -1);
    ``n`` the evaluable arcs, ``low``/``high`` the bootstrap interval.
  """
  if not 0 < confidence < 1:
    raise UserError(f"confidence must be in (0, 1), got {confidence}")
  pred = _check(pred, arcs)
  N, L, H, _ = pred.shape
  a = evaluable_arcs(pred, arcs)
  rng = np.random.default_rng(seed)
  seq, dep, head = (a[c].to_numpy(np.int64) for c in ("sequence", "dependent", "head"))
  from_dep = pred[seq, :, :, dep].reshape(len(a), L * H) if len(a) else np.zeros((0, L * H))
  from_head = pred[seq, :, :, head].reshape(len(a), L * H) if len(a) else np.zeros((0, L * H))
  offsets = tuple(int(o) for o in offsets)
  rows = []
  for rel in relations_to_score(a, relations, min_arcs):
    sel = (a["relation"] == rel).to_numpy()
    sequences, inverse = np.unique(seq[sel], return_inverse=True)
    n_seq = np.bincount(inverse, minlength=len(sequences)).astype(np.float64)
    for direction in DIRECTIONS:
      if direction == "dep2head":
        hit = from_dep[sel] == head[sel][:, None]
        base = np.stack([head[sel] - dep[sel] == o for o in offsets], axis=1)
      else:
        hit = from_head[sel] == dep[sel][:, None]
        base = np.stack([dep[sel] - head[sel] == o for o in offsets], axis=1)
      correct = np.concatenate([hit, base], axis=1).astype(np.float64)   # [A_rel, LH + O]
      n = int(sel.sum())
      acc = correct.mean(0) if n else np.full(correct.shape[1], np.nan)
      per_seq = np.zeros((len(sequences), correct.shape[1]))
      np.add.at(per_seq, inverse, correct)
      low, high = _bootstrap(per_seq, n_seq, bootstrap if n else 0, rng, confidence)
      for j in range(correct.shape[1]):
        if j < L * H:
          kind, layer, hd, off = "head", j // H, j % H, np.nan
        else:
          kind, layer, hd, off = "offset", -1, -1, offsets[j - L * H]
        rows.append((rel, direction, kind, layer, hd, off, acc[j], n, low[j], high[j]))
  table = pd.DataFrame(rows, columns=list(PARSER_COLUMNS))
  return table.astype({"layer": np.int64, "head": np.int64, "n": np.int64})


def best_heads(table: pd.DataFrame) -> pd.DataFrame:
  """Per relation and direction: the best head (layer, head, accuracy, low, high) against the best
  fixed offset (``baseline_offset``, ``baseline_accuracy``, ``baseline_low``, ``baseline_high``);
  ``beats_baseline``: the head's interval lies above the baseline's accuracy. Ordered as the
  table; relations with no arc are skipped."""
  rows = []
  for (rel, direction), g in table.groupby(["relation", "direction"], sort=False):
    if g["n"].iloc[0] == 0:
      continue
    heads, base = g[g["kind"] == "head"], g[g["kind"] == "offset"]
    best = heads.loc[heads["accuracy"].idxmax()]
    b = base.loc[base["accuracy"].idxmax()]
    rows.append({"relation": rel, "direction": direction, "n": int(best["n"]),
                 "layer": int(best["layer"]), "head": int(best["head"]),
                 "accuracy": best["accuracy"], "low": best["low"], "high": best["high"],
                 "baseline_offset": int(b["offset"]), "baseline_accuracy": b["accuracy"],
                 "baseline_low": b["low"], "baseline_high": b["high"],
                 "beats_baseline": bool(best["low"] > b["accuracy"])})
  return pd.DataFrame(rows)


def parsing_heads(table: pd.DataFrame, relation: str, direction: str = "dep2head") -> np.ndarray:
  """bool ``[l, h]``: the heads whose interval for ``relation`` lies above the best offset's
  accuracy (a head that parses the relation better than any fixed offset)."""
  g = table[(table["relation"] == relation) & (table["direction"] == direction)]
  heads = g[g["kind"] == "head"]
  L, H = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
  base = g[g["kind"] == "offset"]["accuracy"].max()
  out = np.zeros((L, H), bool)
  good = heads[heads["low"] > base]
  out[good["layer"].to_numpy(), good["head"].to_numpy()] = True
  return out


def role_agreement(table: pd.DataFrame, tests: pd.DataFrame,
                   relations: Sequence[str] = DEFAULT_RELATIONS,
                   direction: str = "dep2head") -> pd.DataFrame:
  """How the sieve's syntactic roles (``tests.csv``: ``assigned`` and ``mean`` per head for the
  role of the same name) agree with the parsing heads of ``parsing_heads``, per relation:
  ``role_heads``, ``parsing_heads``, ``both``, ``jaccard`` (NaN when both are empty) and the
  Spearman correlation over heads of the role's mean sieve bias and the head's accuracy
  (``spearman``, ``spearman_p``). Relations without a role in ``tests`` are skipped."""
  rows = []
  for rel in relations:
    t = tests[tests["role"] == rel]
    g = table[(table["relation"] == rel) & (table["direction"] == direction)
              & (table["kind"] == "head")]
    if t.empty or g.empty or g["n"].iloc[0] == 0:
      continue
    L, H = int(g["layer"].max()) + 1, int(g["head"].max()) + 1
    role = np.zeros((L, H), bool)
    sieve = np.full((L, H), np.nan)
    role[t["layer"].to_numpy(), t["head"].to_numpy()] = t["assigned"].to_numpy(bool)
    sieve[t["layer"].to_numpy(), t["head"].to_numpy()] = t["mean"].to_numpy(float)
    acc = np.full((L, H), np.nan)
    acc[g["layer"].to_numpy(), g["head"].to_numpy()] = g["accuracy"].to_numpy(float)
    parse = parsing_heads(table, rel, direction)
    both, either = int((role & parse).sum()), int((role | parse).sum())
    ok = ~np.isnan(sieve) & ~np.isnan(acc)
    rho, p = (stats.spearmanr(sieve[ok], acc[ok]) if ok.sum() > 2 else (np.nan, np.nan))
    rows.append({"relation": rel, "direction": direction, "role_heads": int(role.sum()),
                 "parsing_heads": int(parse.sum()), "both": both,
                 "jaccard": both / either if either else np.nan,
                 "spearman": float(rho), "spearman_p": float(p)})
  return pd.DataFrame(rows, columns=["relation", "direction", "role_heads", "parsing_heads", "both",
                                     "jaccard", "spearman", "spearman_p"])
