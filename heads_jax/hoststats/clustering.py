"""Head clustering on distance features (Guan et al. COLING 2020; host, numpy/scipy/sklearn).

Head features: the 21 distance features (order `batch.DISTANCE_FEATURES`: window_0..window_15,
self, cls, sep, comma, period) averaged over sequences, one row per head in (layer, head)
order, ``[l*h, d]``.

Clusters: K-means (default; sklearn's Lloyd/Elkan iterations, k = 4, ``n_init`` restarts,
fixed seed: a reading, Guan et al. cite Hartigan and Wong 1979, DESIGN.md section 3) or a
Gaussian mixture (sklearn, diagonal covariances: 21 features of ~100 heads are too few for full
covariance matrices; the features sum to 1, so a full one would be singular as well).

Outliers (`fit_types`; DESIGN.md section 3, "Guan's types"). Two rules, applied to every fit
and refit (up to ``MAX_REFITS`` times): *by spread*, a head farther from its centroid than
Tukey's far-out fence of all heads' distances to their centroids (Q3 + ``OUTLIER_FENCE`` x IQR,
3 x IQR) is an outlier head; *by size*, a cluster holding fewer than ``min_share`` (5%) of the
heads is an outlier cluster (Guan et al.'s smallest type, vertical, is 13.28% of the heads; 3
extreme heads of 72 are 4.2%). Outlier heads are set aside and the method is refit with the
same k on the others, so that a few extreme heads can neither take a cluster of their own
(the size rule) nor drag a type's centroid (the spread rule); afterwards every head, the
outliers included, gets the cluster of the refit model (K-means: the nearest centroid), and
the names are judged on the clusters' members without the outliers. ``info["outliers"]``
lists them.

Masses. Each head's attention is read as three masses, per sequence and then averaged over
the sequences: *near* = self + the windows that hold the keys up to ``near_tokens`` (4) tokens
away, *far* = the other windows, *special* = [CLS] + [SEP] + comma + period (the three sum to
1). The windows are a sixteenth of each sequence's length wide, so a fixed number of windows
would cover 3 tokens at length 25 and 47 at length 384 ("near" would drift with the length: a
head attending to its 5 neighbours reads 0.37 at 25 tokens and 0.60 at 384); instead each
sequence counts the fewest whole windows that hold the distances 1..``near_tokens``
(``floor(16 * near_tokens / n) + 1`` windows), the closest a fixed token width the
proportional windows allow. Without the lengths (``lengths=None``) a fixed ``near_windows`` (2)
is used and said in ``info["reference"]``.

Reference (uniform attention at the data's lengths, `uniform_reference`): the near, far and
special masses that attention spread evenly over each sequence's real keys would have, from
each sequence's length n (self 1/n; the windows by counting the key distances) and the share
of its keys that are special tokens (``special_share``: exact when given, else a lower bound
2/n, [CLS] and one [SEP]), averaged over the sequences.

Names (k = 4). Guan et al. section 4 defines the types (guan2020_how_far_does_bert_look_at.txt):

* dense: "the heads in this type have the highest attention at long range windows and
  relatively small attention weights to the special tokens";
* diagonal: "Its distance features show large values in the short-range windows and medium
  values in the special tokens";
* dense+vertical: "Its distance features have large values at long range windows and special
  tokens";
* vertical: "Its distance features have large values at special tokens, which are much higher
  than other types" ("This type has mostly strong vertical patterns").

Each definition is a list of conditions: *between types* (`DEFINITIONS`: one type's mass above
another's, e.g. dense's far above every other type's) and *against the reference*
(`REFERENCE_DEFINITIONS`), where "large" and "small" are read against uniform attention:

* short-range windows large (diagonal): the near keys get at least ``NEAR_LIFT`` (2) times the
  attention per key of the far keys, uniform attention's ratio being 1; not large (dense): less;
* long-range windows large (dense, dense+vertical): far mass at least ``FAR_LIFT`` (1/2) of
  uniform attention's (uniform attention has nearly the most far mass a head can have);
  not large (vertical, "mostly strong vertical patterns"): less;
* special tokens large (dense+vertical, vertical): at least ``SPECIAL_LIFT`` (2) times uniform
  attention's special mass; not large (dense, "relatively small"): less (judged only with an
  exact ``special_share``).

Margins are in units of the clusters' own spread: a condition between types A and B on a mass
is ``(mean_A - mean_B) / sqrt((sd_A^2 + sd_B^2) / 2)`` over their member heads; a reference
condition ``g >= 0`` (g linear in a head's masses) is ``mean(g) / sd(g)`` over the cluster's
member heads (sd at least ``SPREAD_FLOOR`` = 0.01 attention mass). Of the 24 ways to give the
four names to the four clusters, the one that names the most clusters (below) is chosen, and
among those the one whose margins, sorted ascending, are lexicographically largest (so that a
type's heads keep their name when another type is absent and its cluster went to a split of
theirs); a cluster's *margin* is the smallest of its type's conditions. A cluster
whose margin is not positive does not meet its type's definition and carries no Guan name: it
is "unnamed (closest: X, margin m)" (`unnamed_name`) in clusters.csv, clusters.json and all
that reads them (shares, layer verdicts, ablation groups, figures); so a type absent from the
heads is reported absent. The conditions between types are judged among the clusters still
named, dropping one at a time the cluster that fails the most of them. A margin below ``LOW_MARGIN`` (1
spread) is flagged "low margin"; it gates no name (it is shown beside it).

Windowed layers (ModernBERT's local layers, ``windows``): the distance features and the
reference are not window-aware. Guan et al.'s features are where a head's attention lies, in
windows of n/16 of the whole sequence; a windowed layer's heads are read in the same windows as
the other layers' so that all heads share one feature space and one clustering (a per-layer
reference would name the two kinds of layers under two definitions). A local head cannot reach
the far windows, so it tends to read as diagonal or vertical rather than dense; clusters.json
says so (``reference["windowed_layers"]``: the layers, the half window and this note).

For k != 4 the clusters are not Guan et al.'s types ("We still get stable clustering results
with 3 or 5 clusters, but the patterns can not be distinguished by human-being"): they are
named "cluster 1" .. "cluster k", ordered by their special mass, largest first.

Cluster ids are renumbered so that their order follows the types in ``CLUSTER_NAMES`` (dense,
diagonal, dense+vertical, vertical; an unnamed cluster by its closest type): for k = 4, id 0
is dense (or unnamed, closest dense), 1 diagonal, 2 dense+vertical, 3 vertical.

Stability (Von Luxburg 2010, as Guan et al. section 4: "We randomly split 50% training data to
fit clustering models and predict on the whole dataset"): ``stability_fits`` (10) fits of the
same procedure (outlier refits included) on random halves of the heads, each predicting all
heads, each fit's labels aligned to the full fit's ids (Hungarian assignment on the label
contingency matrix); stability = the share of heads two fits label alike, averaged over all
pairs of fits. (Guan et al.'s Table 1 values are not multiples of 1/384, so theirs is not the
share of heads labelled alike by all 10 fits, which is reported as ``stability_all_fits``;
the pair average has the resolution their table needs: tests/hoststats/test_paper.py.) None
when half the heads are fewer than k.

t-SNE (sklearn, 2-D, PCA init, fixed seed) for the picture; perplexity = min(30, (n - 1) / 3)
so that it stays below the number of heads n; heads fewer than 3 get (0, 0).

Host-only module (numpy, scipy, sklearn, pandas); no jax.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd
from scipy import optimize
from sklearn import cluster as sk_cluster
from sklearn import manifold
from sklearn import mixture

from heads_jax.data import vocabulary
from heads_jax import contract

METHODS = ("kmeans", "gmm")
CLUSTER_NAMES = ("dense", "diagonal", "dense+vertical", "vertical")
MASSES = ("near", "far", "special")          # the columns of `type_masses` / `head_masses`
CLUSTER_COLUMNS = contract.CLUSTER_COLUMNS
FEATURES = vocabulary.DISTANCE_FEATURES
NUM_WINDOWS = 16
_SPECIAL = [FEATURES.index(f) for f in ("cls", "sep", "comma", "period")]
_SELF = FEATURES.index("self")
MIN_SHARE = 0.05       # a cluster with fewer heads than this share is an outlier cluster
OUTLIER_FENCE = 3.0    # Tukey's far-out fence: Q3 + 3 IQR of the distances to the centroids
MAX_REFITS = 3
NEAR_TOKENS = 4        # "near": self and the keys up to this many tokens away (whole windows)
NEAR_LIFT = 2.0        # short-range windows "large": near attention per key >= 2x the far's
FAR_LIFT = 0.5         # long-range windows "large": far mass >= 1/2 of uniform attention's
SPECIAL_LIFT = 2.0     # special tokens "large": special mass >= 2x uniform attention's
LOW_MARGIN = 1.0       # a definition met by less than one spread is flagged
SPREAD_FLOOR = 0.01    # the smallest spread (attention mass) a margin is divided by
UNNAMED = "unnamed"
WINDOWED_NOTE = ("the distance features and the reference are not window-aware: a windowed "
                 "layer's heads are read in the same windows of n/16 and against the same "
                 "uniform attention over the whole sequence as the other layers' (module "
                 "docstring, 'Windowed layers')")

# Guan et al. section 4's definitions between types, as inequalities (higher type, lower type,
# mass): the mass of the first type exceeds the second's. Each type lists the inequalities its
# own sentence states (an inequality may belong to two types' definitions).
DEFINITIONS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "dense": (("dense", "diagonal", "far"), ("dense", "dense+vertical", "far"),
              ("dense", "vertical", "far"),
              ("dense+vertical", "dense", "special"), ("vertical", "dense", "special")),
    "diagonal": (("diagonal", "dense", "near"), ("diagonal", "dense+vertical", "near"),
                 ("diagonal", "vertical", "near"),
                 ("diagonal", "dense", "special"), ("vertical", "diagonal", "special")),
    "dense+vertical": (("dense+vertical", "diagonal", "far"), ("dense+vertical", "vertical", "far"),
                       ("dense+vertical", "dense", "special"),
                       ("dense+vertical", "diagonal", "special")),
    "vertical": (("vertical", "dense", "special"), ("vertical", "diagonal", "special"),
                 ("vertical", "dense+vertical", "special")),
}
# The conditions against uniform attention (module docstring), each read from its sentence.
REFERENCE_CONDITIONS = {
    "near_large": "short-range windows large: near keys get at least 2x the attention per key "
                  "of far keys (uniform attention: 1x)",
    "near_not_large": "short-range windows not large: near keys get less than 2x the attention "
                      "per key of far keys",
    "far_large": "long-range windows large: far mass at least half of uniform attention's",
    "far_not_large": "long-range windows not large: far mass below half of uniform attention's",
    "special_large": "special tokens large: special mass at least 2x uniform attention's",
    "special_not_large": "special tokens relatively small: special mass below 2x uniform "
                         "attention's",
}
REFERENCE_DEFINITIONS: dict[str, tuple[str, ...]] = {
    "dense": ("far_large", "near_not_large", "special_not_large"),
    "diagonal": ("near_large",),
    "dense+vertical": ("far_large", "special_large"),
    "vertical": ("special_large", "far_not_large"),
}
# The sentence each definition rests on (guan2020_how_far_does_bert_look_at.txt, section 4).
DEFINITION_QUOTES = {
    "dense": "the heads in this type have the highest attention at long range windows and "
             "relatively small attention weights to the special tokens",
    "diagonal": "Its distance features show large values in the short-range windows and medium "
                "values in the special tokens",
    "dense+vertical": "Its distance features have large values at long range windows and "
                      "special tokens",
    "vertical": "Its distance features have large values at special tokens, which are much "
                "higher than other types",
}
_ALL_INEQUALITIES = tuple(dict.fromkeys(i for d in DEFINITIONS.values() for i in d))
_UNNAMED_RE = re.compile(r"^unnamed \(closest: (.+), margin ([-+0-9.]+|nan)\)$")


def unnamed_name(closest: str, margin: float) -> str:
  """The name of a cluster that does not meet its closest type's definition."""
  return f"{UNNAMED} (closest: {closest}, margin {margin:+.2f})"


def closest_type(name: str) -> str | None:
  """The closest type of an unnamed cluster's name (`unnamed_name`), else None."""
  m = _UNNAMED_RE.match(str(name))
  return m.group(1) if m else None


def type_of(name: str) -> str | None:
  """The Guan type a cluster name stands for: the type itself when met, None for an unnamed
  cluster ("unnamed (closest: ...)") and for "cluster k"."""
  return str(name) if str(name) in CLUSTER_NAMES else None


def unnamed_types(names) -> list[str]:
  """Guan's types that a clustering's names leave unnamed (their closest cluster does not meet
  the definition, or no cluster is even closest to them), in `CLUSTER_NAMES` order; [] when
  every type names a cluster. ``names``: the cluster names of a k = 4 clustering (any
  iterable, e.g. the clusters.csv column)."""
  have = {str(n) for n in names}
  return [t for t in CLUSTER_NAMES if t not in have]


def head_features(distance) -> np.ndarray:
  """Mean over sequences of the distance features: float64 ``[l*h, d]`` in (layer, head) order.

  Args:
    distance: float ``[b, l, h, d]`` (d = 21). NaN entries (if any) are left out of the mean.
  """
  distance = np.asarray(distance, np.float64)
  d = len(FEATURES)
  if distance.ndim != 4 or distance.shape[-1] != d or distance.shape[0] == 0:
    raise ValueError(f"distance must have shape [b, l, h, {d}] with b >= 1; got {distance.shape}")
  valid = ~np.isnan(distance)
  count = valid.sum(0)
  if (count == 0).any():
    raise ValueError("some head has no non-NaN distance feature over all sequences; check the "
                     "distance features written by the statistics stage")
  mean = np.where(valid, distance, 0.0).sum(0) / count
  return mean.reshape(-1, d)


def near_window_count(lengths, near_tokens: int = NEAR_TOKENS) -> np.ndarray:
  """int ``[b]``: the windows counted as near in a sequence of each length, the fewest whole
  windows that hold the key distances 1..``near_tokens`` (window j holds the distances
  ``[j n / 16, (j + 1) n / 16)``)."""
  n = np.maximum(np.asarray(lengths, np.int64), 1)
  if near_tokens < 1:
    raise ValueError(f"near_tokens must be at least 1; got {near_tokens}")
  return np.clip(NUM_WINDOWS * int(near_tokens) // n + 1, 1, NUM_WINDOWS)


def special_share(token_class, attention_mask) -> np.ndarray:
  """float ``[b]``: the share of each sequence's real keys that are [CLS], [SEP], comma or
  period (the special mass of uniform attention)."""
  tc, mask = np.asarray(token_class), np.asarray(attention_mask) > 0
  special = np.isin(tc, (vocabulary.TOKEN_CLS, vocabulary.TOKEN_SEP, vocabulary.TOKEN_COMMA,
                         vocabulary.TOKEN_PERIOD)) & mask
  return special.sum(-1) / np.maximum(mask.sum(-1), 1)


def uniform_reference(lengths, near_tokens: int = NEAR_TOKENS, special=None) -> dict:
  """The near, far and special mass of attention spread evenly over each sequence's real keys,
  averaged over the sequences (module docstring, "Reference").

  Args:
    lengths: int ``[b]``, real positions per sequence.
    special: float ``[b]`` (or a scalar), the share of each sequence's keys that are special
      tokens (`special_share`); None: the lower bound 2/n ([CLS] and one [SEP]).
  Returns ``{"near", "far", "special", "special_exact"}``.
  """
  n_all = np.maximum(np.asarray(lengths, np.int64).ravel(), 1)
  if n_all.size == 0:
    raise ValueError("uniform_reference needs at least one sequence length")
  exact = special is not None
  s = (np.broadcast_to(np.asarray(special, np.float64), n_all.shape) if exact
       else np.minimum(2.0 / n_all, 1.0))
  w_all = near_window_count(n_all, near_tokens)
  near_of = {}
  for n, w in set(zip(n_all.tolist(), w_all.tolist())):
    d = np.arange(1, n)
    window = np.minimum(NUM_WINDOWS - 1, (NUM_WINDOWS * d) // n)
    pairs = 2.0 * (n - d)
    near_of[(n, w)] = (n + pairs[window < w].sum()) / (n * n)
  near = np.array([near_of[(n, w)] for n, w in zip(n_all.tolist(), w_all.tolist())])
  # special tokens take their share of the keys evenly from the windows
  return {"near": float(np.mean(near * (1 - s))), "far": float(np.mean((1 - near) * (1 - s))),
          "special": float(np.mean(s)), "special_exact": bool(exact)}


def _long_sequence_reference(near_windows: int) -> dict:
  """Uniform attention's masses when the lengths are unknown: the long-sequence limit, where
  the key distance over n has the density 2 (1 - x) on [0, 1)."""
  x = near_windows / NUM_WINDOWS
  near = 2 * x - x * x
  return {"near": near, "far": 1 - near, "special": None, "special_exact": False}


def type_masses(centroids, near_windows: int = 2) -> np.ndarray:
  """near, far and special attention mass of each row ``[k, d]`` of mean distance features,
  near = self + the ``near_windows`` nearest windows: ``[k, 3]`` (`MASSES`)."""
  c = np.asarray(centroids, np.float64)
  if not 1 <= near_windows < 16:
    raise ValueError(f"near_windows must be in 1..15; got {near_windows}")
  near = c[:, _SELF] + c[:, :near_windows].sum(1)
  far = c[:, near_windows:16].sum(1)
  special = c[:, _SPECIAL].sum(1)
  return np.stack([near, far, special], axis=1)


def head_masses(distance, lengths=None, near_tokens: int = NEAR_TOKENS,
                near_windows: int = 2) -> np.ndarray:
  """Each head's near, far and special mass, per sequence then averaged over the sequences:
  float64 ``[l*h, 3]`` (`MASSES`; module docstring, "Masses").

  Args:
    distance: float ``[b, l, h, 21]``.
    lengths: int ``[b]``: near = self + `near_window_count` windows per sequence; None: a
      fixed ``near_windows``.
  """
  distance = np.asarray(distance, np.float64)
  b = distance.shape[0]
  if lengths is None:
    w = np.full(b, int(near_windows))
  else:
    lengths = np.asarray(lengths).ravel()
    if lengths.shape != (b,):
      raise ValueError(f"lengths must have one entry per sequence ({b}); got {lengths.shape}")
    w = near_window_count(lengths, near_tokens)
  near_mask = (np.arange(NUM_WINDOWS)[None] < w[:, None]).astype(np.float64)   # [b, 16]
  win = np.nan_to_num(distance[..., :NUM_WINDOWS])
  near = distance[..., _SELF] + np.einsum("blhw,bw->blh", win, near_mask)
  far = np.einsum("blhw,bw->blh", win, 1.0 - near_mask)
  special = distance[..., _SPECIAL].sum(-1)
  masses = np.stack([near, far, special], -1)                                   # [b, l, h, 3]
  masses[np.isnan(distance).any(-1)] = np.nan
  with np.errstate(invalid="ignore"):
    out = np.nanmean(masses, axis=0)
  return out.reshape(-1, 3)


def _ref_coefficients(reference: dict) -> dict:
  """Each reference condition as ``(coef [3], offset)``: met when ``coef . masses + offset >= 0``
  (None where the reference cannot judge it)."""
  near_u, far_u, s_u = reference["near"], reference["far"], reference["special"]
  rho = near_u / max(far_u, 1e-12)
  out = {"near_large": (np.array([1.0, -NEAR_LIFT * rho, 0.0]), 0.0),
         "near_not_large": (np.array([-1.0, NEAR_LIFT * rho, 0.0]), 0.0),
         "far_large": (np.array([0.0, 1.0, 0.0]), -FAR_LIFT * far_u),
         "far_not_large": (np.array([0.0, -1.0, 0.0]), FAR_LIFT * far_u),
         "special_large": None, "special_not_large": None}
  if s_u is not None:
    out["special_large"] = (np.array([0.0, 0.0, 1.0]), -SPECIAL_LIFT * s_u)
    if reference.get("special_exact"):
      out["special_not_large"] = (np.array([0.0, 0.0, -1.0]), SPECIAL_LIFT * s_u)
  return out


def _spread(x) -> float:
  x = np.asarray(x, np.float64)
  return max(float(x.std()) if x.size > 1 else 0.0, SPREAD_FLOOR)


def name_types(masses, labels, reference: dict | None = None, members=None) -> dict:
  """Guan et al.'s type of each of four clusters (module docstring, "Names").

  Args:
    masses: float ``[n, 3]``, each head's near / far / special mass (`head_masses`).
    labels: int ``[n]``, each head's cluster 0..3.
    reference: uniform attention's masses (`uniform_reference`), or None (no reference
      conditions judged).
    members: bool ``[n]``, the heads the names are judged on (default all; the outliers are
      left out).
  Returns ``{"types": [4] (the type each cluster is closest to), "names": [4] (the type, or
  "unnamed (closest: X, margin m)"), "margins": [4] (in spreads), "unmet": [4] lists of the
  failed conditions in words, "conditions": [4] lists of ``{condition, margin}``, "masses":
  [4][3] (the members' means), "spreads": [4][3] (their sds)}``.
  """
  masses = np.asarray(masses, np.float64)
  labels = np.asarray(labels)
  members = np.ones(len(labels), bool) if members is None else np.asarray(members, bool)
  k = len(CLUSTER_NAMES)
  groups = [masses[(labels == c) & members] for c in range(k)]
  groups = [g if len(g) else masses[labels == c] for c, g in zip(range(k), groups)]
  if any(len(g) == 0 for g in groups):
    raise ValueError("every one of the four clusters needs at least one head")
  mean = np.array([np.nanmean(g, 0) for g in groups])
  var = np.array([np.nanvar(g, 0) for g in groups])
  col = {m: i for i, m in enumerate(MASSES)}
  coefs = _ref_coefficients(reference) if reference else {}
  ref_margin = {}                                         # (cluster, condition) -> margin
  for c, g in enumerate(groups):
    for cond, co in coefs.items():
      if co is not None:
        vals = g @ co[0] + co[1]
        ref_margin[(c, cond)] = float(np.nanmean(vals)) / _spread(vals[~np.isnan(vals)])

  def rel_margin(a, b, m):
    j = col[m]
    return float(mean[a, j] - mean[b, j]) / max(math.sqrt((var[a, j] + var[b, j]) / 2),
                                                SPREAD_FLOOR)

  def conditions(cluster_of):
    out = {}
    for t, c in cluster_of.items():
      own = []
      for hi, lo, m in DEFINITIONS[t]:
        a, b = mean[cluster_of[hi], col[m]], mean[cluster_of[lo], col[m]]
        own.append((f"{m} of {hi} ({a:.3f}) above {lo}'s ({b:.3f})",
                    f"{m} of {hi} ({a:.3f}) not above {lo}'s ({b:.3f})",
                    rel_margin(cluster_of[hi], cluster_of[lo], m)))
      for cond in REFERENCE_DEFINITIONS[t]:
        if (c, cond) in ref_margin:
          own.append((REFERENCE_CONDITIONS[cond], "not met: " + REFERENCE_CONDITIONS[cond],
                      ref_margin[(c, cond)]))
      out[t] = own
    return out

  def gate(conds):
    """The unnamed types and each type's judged conditions of one assignment: a cluster that
    fails a condition against the reference meets no definition; the conditions between types
    are then judged among the clusters still named (a type cannot be "above" or "below" one
    that is absent), dropping the cluster that fails the most of them (then the one failing
    by the most), one at a time, until none fails: a type that fails only against a cluster
    that fails its own definition more broadly keeps its name."""
    unnamed = {t for t in CLUSTER_NAMES
               if any(m <= 0 for text, _, m in conds[t] if text in REFERENCE_CONDITIONS.values())}
    while True:
      judged = {t: [(text, bad, m) for (text, bad, m), rel in zip(conds[t], _relations(t))
                    if not (rel and (set(rel) - {t}) & unnamed)] for t in CLUSTER_NAMES}
      failed = {t: sorted(m for *_, m in judged[t] if m <= 0) for t in CLUSTER_NAMES
                if t not in unnamed}
      more = [t for t in failed if failed[t]]
      if not more:
        return unnamed, judged
      unnamed.add(max(more, key=lambda t: (len(failed[t]), -failed[t][0])))

  # The assignment that names the most clusters; among those, the one whose margins (all
  # conditions), sorted ascending, are lexicographically largest.
  best, best_key = None, None
  for perm in itertools.permutations(range(k)):
    cluster_of = dict(zip(CLUSTER_NAMES, perm))
    conds = conditions(cluster_of)
    unnamed, judged = gate(conds)
    key = (-len(unnamed), sorted(m for own in conds.values() for *_, m in own))
    if best_key is None or key > best_key:
      best, best_key, best_gate = cluster_of, key, (conds, unnamed, judged)
  conds, unnamed, judged = best_gate
  types, names, margins, unmet, listed = [None] * k, [None] * k, [None] * k, [None] * k, [None] * k
  for t, c in best.items():
    own = conds[t] if t in unnamed else judged[t]
    margin = float(min(m for *_, m in own))
    types[c], margins[c] = t, margin
    names[c] = unnamed_name(t, margin) if t in unnamed else t
    unmet[c] = [f"{bad} (margin {m:+.2f})" for _, bad, m in own if m <= 0]
    listed[c] = [{"condition": text, "margin": m, "judged": (text, bad, m) in judged[t]}
                 for text, bad, m in conds[t]]
  return {"types": types, "names": names, "margins": margins, "unmet": unmet,
          "conditions": listed, "masses": mean.tolist(), "spreads": np.sqrt(var).tolist()}


def _relations(t: str) -> list[tuple[str, str] | None]:
  """Per condition of type ``t`` (in `name_types`' order): the two types of a condition between
  types, None for one against the reference."""
  return ([(hi, lo) for hi, lo, _ in DEFINITIONS[t]]
          + [None for _ in REFERENCE_DEFINITIONS[t]])


def name_clusters(centroids, near_windows: int = 2) -> list[str]:
  """Names of k != 4 centroids: "cluster 1" .. "cluster k" by decreasing special mass."""
  centroids = np.asarray(centroids, np.float64)
  special = type_masses(centroids, near_windows)[:, 2]
  rank = np.argsort(-special, kind="stable")
  names = [""] * len(rank)
  for i, c in enumerate(rank):
    names[c] = f"cluster {i + 1}"
  return names


def _fit(features, k: int, method: str, seed: int, n_init: int):
  if method == "kmeans":
    model = sk_cluster.KMeans(n_clusters=k, n_init=n_init, random_state=seed)
    model.fit(features)
    return model, model.cluster_centers_
  if method == "gmm":
    model = mixture.GaussianMixture(n_components=k, covariance_type="diag", n_init=n_init,
                                    random_state=seed, reg_covar=1e-6)
    model.fit(features)
    return model, model.means_
  raise ValueError(f"method must be one of {METHODS}; got {method!r}")


def align_labels(labels, reference, k: int) -> np.ndarray:
  """Relabels ``labels`` to best agree with ``reference`` (Hungarian on the contingency matrix)."""
  labels = np.asarray(labels)
  reference = np.asarray(reference)
  table = np.zeros((k, k), np.int64)
  np.add.at(table, (labels, reference), 1)
  rows, cols = optimize.linear_sum_assignment(table, maximize=True)
  mapping = np.arange(k)
  mapping[rows] = cols
  return mapping[labels]


def fit_types(features, k: int, method: str = "kmeans", seed: int = 0, n_init: int = 10,
              min_share: float = MIN_SHARE, population=None, fence: float | None = OUTLIER_FENCE):
  """Fits ``k`` clusters to ``features``, setting outlier heads aside (module docstring,
  "Outliers": by spread, heads beyond Tukey's far-out fence of the distances to their
  centroids; by size, the heads of a cluster holding fewer than ``min_share`` of the
  ``population`` heads it predicts; default population: ``features`` themselves; the
  stability's half fits pass all heads, so that the rule is the same as the full fit's).
  ``fence`` None turns the spread rule off.

  Returns (model, centroids ``[k, d]``, outlier bool ``[n]``, refits): the model of the last fit
  (its ``predict`` gives every head's cluster), the heads of ``features`` set aside and the
  number of refits.
  """
  features = np.asarray(features, np.float64)
  population = features if population is None else np.asarray(population, np.float64)
  n = features.shape[0]
  keep = np.ones(n, bool)
  refits = 0
  while True:
    model, centroids = _fit(features[keep], k, method, seed, n_init)
    centroids = np.asarray(centroids)
    sizes = np.bincount(model.predict(population), minlength=k)
    small = sizes < min_share * population.shape[0]
    idx = np.flatnonzero(keep)
    label = model.predict(features[keep])
    drop = small[label]
    if fence is not None and idx.size > k and centroids.ndim == 2:
      dist = np.sqrt(((features[keep] - centroids[label]) ** 2).sum(-1))
      q1, q3 = np.percentile(dist, [25, 75])
      drop |= dist > q3 + fence * (q3 - q1) + 1e-12
    drop = idx[drop]
    if drop.size == 0 or refits >= MAX_REFITS or keep.sum() - drop.size < k:
      return model, centroids, ~keep, refits
    keep[drop] = False
    refits += 1


def clustering_stability(features, reference, k: int, method: str = "kmeans", seed: int = 0,
                         fits: int = 10, n_init: int = 10, min_share: float = MIN_SHARE,
                         all_fits: bool = False) -> float | None:
  """Von Luxburg's stability as Guan et al. read it (module docstring): the share of heads two
  half-sample fits (each with `fit_types`' outlier refits) label alike, averaged over all pairs
  of ``fits`` fits; with ``all_fits``, the share of heads all the fits label alike.

  Args:
    features: ``[n, d]`` head features.
    reference: int ``[n]`` labels of the full fit (the ids the fits are aligned to).
  """
  labels = stability_labels(features, reference, k, method, seed, fits, n_init, min_share)
  if labels is None:
    return None
  if all_fits:
    return float((labels == labels[:1]).all(0).mean())
  return pairwise_agreement(labels)


def pairwise_agreement(labels) -> float:
  """The share of heads two labellings ``[fits, n]`` agree on, averaged over all pairs of
  labellings (1.0 for a single one)."""
  labels = np.asarray(labels)
  f = labels.shape[0]
  if f < 2:
    return 1.0
  pairs = [(labels[i] == labels[j]).mean() for i in range(f) for j in range(i + 1, f)]
  return float(np.mean(pairs))


def stability_labels(features, reference, k: int, method: str = "kmeans", seed: int = 0,
                     fits: int = 10, n_init: int = 10, min_share: float = MIN_SHARE):
  """int ``[fits, n]``: every half-sample fit's labels of all heads, aligned to ``reference``;
  None when half the heads are fewer than k."""
  features = np.asarray(features, np.float64)
  n = features.shape[0]
  half = n // 2
  if half < k or fits < 1:
    return None
  rng = np.random.default_rng(seed)
  labels = np.empty((fits, n), np.int64)
  for i in range(fits):
    subset = rng.choice(n, size=half, replace=False)
    model, *_ = fit_types(features[subset], k, method, seed + 1 + i, n_init, min_share,
                          population=features)
    labels[i] = align_labels(model.predict(features), reference, k)
  return labels


def tsne_embedding(features, seed: int = 0) -> tuple[np.ndarray, float | None]:
  """2-D t-SNE of ``[n, d]`` features: (``[n, 2]``, perplexity used or None)."""
  features = np.asarray(features, np.float64)
  n = features.shape[0]
  if n < 3:
    return np.zeros((n, 2)), None
  perplexity = min(30.0, (n - 1) / 3.0)
  tsne = manifold.TSNE(n_components=2, perplexity=perplexity, init="pca",
                       learning_rate="auto", random_state=seed)
  return tsne.fit_transform(features), perplexity


def cluster_heads(distance, *, k: int = 4, method: str = "kmeans", seed: int = 0,
                  n_init: int = 10, stability_fits: int = 10, near_windows: int = 2,
                  tsne: bool = True, min_share: float = MIN_SHARE, lengths=None,
                  special_share=None, near_tokens: int = NEAR_TOKENS,
                  windows=None) -> tuple[pd.DataFrame, dict]:
  """Clusters the heads of a run by their mean distance features.

  Args:
    distance: float ``[b, l, h, d]`` (d = 21) per-sequence distance features.
    k: number of clusters (Guan et al.: 4).
    method: "kmeans" or "gmm".
    seed: seed of every fit, of the stability halves and of t-SNE.
    n_init: restarts per fit.
    min_share: a cluster with fewer heads than this share of them is an outlier cluster (its
      heads set aside and the method refit; `fit_types`).
    stability_fits: number of half-sample fits for the stability (0 skips it: None).
    near_windows: windows counted as "near" when ``lengths`` is None.
    tsne: compute the t-SNE embedding (else tsne_x = tsne_y = NaN).
    lengths: int ``[b]``, real positions per sequence: near in tokens (``near_tokens``) and the
      uniform reference at these lengths (module docstring); None: a fixed ``near_windows`` and
      the long-sequence reference.
    special_share: float ``[b]``, each sequence's share of special keys (`special_share`), or
      None (the lower bound 2/n).
    windows: per layer, the half window of a windowed layer (ModernBERT's local layers) or
      None; only reported (``info["reference"]["windowed_layers"]``: the features and the
      reference are full attention's, module docstring "Windowed layers").

  Returns:
    (df, info): df one row per head with exactly ``CLUSTER_COLUMNS`` (layer, head, the 21
    features, cluster, cluster_name, tsne_x, tsne_y); info: method, k, seed, n_init,
    near_windows, near_tokens, feature_names, names (per cluster id: the type, "unnamed
    (closest: X, margin m)" or "cluster j"), types (k = 4: the closest type per id), unnamed
    (the types no cluster meets), centroids (``[k][d]``), sizes, naming (``[k][5]``, columns
    naming_columns: near, far and special mass of the cluster's members, the margin in spreads
    and its check; k != 4: the masses only), spreads (``[k][3]``), conditions (per id, each
    condition of its type with its margin), name_margins (``[k]``; k = 4), low_margin (names
    whose margin is below `LOW_MARGIN`), head_masses (``[l*h][3]``: each head's near, far and
    special mass as the names read them), reference (uniform attention's masses and how they
    were obtained), thresholds, outliers (the heads set aside, ``[{layer, head,
    cluster_name}]``: the cluster each joined), refits, min_share, stability (pairs of fits),
    stability_all_fits, stability_fits, tsne_perplexity.
  """
  distance = np.asarray(distance)
  l, h = distance.shape[1:3] if distance.ndim == 4 else (0, 0)
  features = head_features(distance)
  n = features.shape[0]
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive integer; got {k!r}")
  if n < k:
    raise ValueError(f"cannot form {k} clusters from {n} heads; use a smaller k")
  masses = head_masses(distance, lengths, near_tokens, near_windows)
  if lengths is not None:
    reference = uniform_reference(lengths, near_tokens, special_share)
    reference["source"] = ("uniform attention at the data's lengths; special tokens' share "
                           + ("exact" if special_share is not None else
                              "a lower bound (2/n: [CLS] and one [SEP]; 'special tokens "
                              "relatively small' judged between types only)"))
  else:
    reference = _long_sequence_reference(near_windows)
    reference["source"] = (f"lengths unknown: near = self + {near_windows} windows, uniform "
                           "attention in the long-sequence limit; special tokens judged "
                           "between types only")
  if windows is not None and any(w is not None for w in windows):
    reference["windowed_layers"] = {
        "layers": [i for i, w in enumerate(windows) if w is not None],
        "half_window": max(w for w in windows if w is not None),
        "note": WINDOWED_NOTE}
  model, centroids, outlier, refits = fit_types(features, k, method, seed, n_init, min_share)
  raw = model.predict(features)
  naming = (name_types(masses, raw, reference, members=~outlier)
            if k == len(CLUSTER_NAMES) else None)
  if naming:
    names, types = naming["names"], naming["types"]
  else:
    names = name_clusters(centroids, near_windows)
    types = [None] * k
  # Renumber: ids ordered by the (closest) type, then "cluster 1", ...; ties in the fit's order.
  order = sorted(range(k), key=lambda c: (CLUSTER_NAMES.index(types[c]) if types[c] else 99,
                                          names[c], c))
  new_id = np.empty(k, np.int64)
  new_id[order] = np.arange(k)
  labels = new_id[raw]
  centroids = np.asarray(centroids)[order]
  names = [names[c] for c in order]
  members = [masses[(raw == c) & ~outlier] if ((raw == c) & ~outlier).any() else masses[raw == c]
             for c in order]
  naming_rows, spreads = [], []
  for i, c in enumerate(order):
    row = [float(x) for x in np.nanmean(members[i], 0)]
    spreads.append([float(x) for x in np.nanstd(members[i], 0)])
    if naming:
      margin = naming["margins"][c]
      row += [margin, ("definition not met: " + "; ".join(naming["unmet"][c])) if margin <= 0
              else ("low margin" if margin < LOW_MARGIN else "ok")]
    naming_rows.append(row)

  stability = stability_all = None
  if stability_fits > 0:
    fit_labels = stability_labels(features, labels, k, method, seed, stability_fits, n_init,
                                  min_share)
    if fit_labels is not None:
      stability = pairwise_agreement(fit_labels)
      stability_all = float((fit_labels == fit_labels[:1]).all(0).mean())
  if tsne:
    embedding, perplexity = tsne_embedding(features, seed)
  else:
    embedding, perplexity = np.full((n, 2), np.nan), None

  layer, head = np.divmod(np.arange(n), h)
  df = pd.DataFrame(features, columns=list(FEATURES))
  df.insert(0, "head", head.astype(np.int64))
  df.insert(0, "layer", layer.astype(np.int64))
  df["cluster"] = labels
  df["cluster_name"] = [names[c] for c in labels]
  df["tsne_x"] = embedding[:, 0]
  df["tsne_y"] = embedding[:, 1]
  df = df[list(CLUSTER_COLUMNS)]

  info = {
      "method": method, "k": int(k), "seed": int(seed), "n_init": int(n_init),
      "near_windows": int(near_windows), "near_tokens": int(near_tokens) if lengths is not None
      else None, "num_layers": int(l), "num_heads": int(h),
      "feature_names": list(FEATURES), "names": names,
      "types": [types[c] for c in order] if naming else None,
      "unnamed": unnamed_types(names) if naming else [],
      "centroids": centroids.tolist(), "sizes": np.bincount(labels, minlength=k).tolist(),
      "naming_columns": list(MASSES) + (["margin", "check"] if naming else []),
      "naming": naming_rows, "spreads": spreads,
      "head_masses": masses.tolist(),
      "conditions": [naming["conditions"][c] for c in order] if naming else None,
      "name_margins": [r[3] for r in naming_rows] if naming else None,
      "low_margin": [n for n, r in zip(names, naming_rows) if naming and r[3] < LOW_MARGIN],
      "reference": reference,
      "thresholds": {"margin_unit": "spread (sd of the members' masses)", "named_above": 0.0,
                     "low_margin": LOW_MARGIN, "near_lift": NEAR_LIFT, "far_lift": FAR_LIFT,
                     "special_lift": SPECIAL_LIFT, "outlier_fence_iqr": OUTLIER_FENCE,
                     "min_share": float(min_share)},
      "outliers": [{"layer": int(i // h), "head": int(i % h), "cluster_name": names[labels[i]]}
                   for i in np.flatnonzero(outlier)],
      "refits": int(refits), "min_share": float(min_share),
      "stability": stability, "stability_all_fits": stability_all,
      "stability_fits": int(stability_fits), "tsne_perplexity": perplexity,
  }
  return df, contract.to_jsonable(info)
