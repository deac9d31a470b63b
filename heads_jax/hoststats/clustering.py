"""Head clustering on distance features (Guan et al. COLING 2020; host, numpy/scipy/sklearn).

Head features: the 21 distance features (order `batch.DISTANCE_FEATURES`: window_0..window_15,
self, cls, sep, comma, period) averaged over sequences, one row per head in (layer, head)
order, ``[l*h, d]``.

Clusters: K-means (default; sklearn's Lloyd/Elkan iterations, k = 4, ``n_init`` restarts,
fixed seed: a reading, Guan et al. cite Hartigan and Wong 1979, DESIGN.md section 3) or a
Gaussian mixture (sklearn, diagonal covariances: 21 features of ~100 heads are too few for full
covariance matrices; the features sum to 1, so a full one would be singular as well).

Outlier clusters. A cluster holding fewer than ``min_share`` (3%) of the heads is too small to
be one of Guan et al.'s types (their smallest, vertical, is 13.28% of the heads): its heads are
set aside as *outlier heads* and the method is refit with the same k on the other heads (up to
``MAX_REFITS`` times, while a cluster stays too small); every head, the outliers included, then
gets the cluster of the refit model (K-means: the nearest centroid), so an outlier head joins
its nearest type. ``info["outliers"]`` lists them.

Names (k = 4; DESIGN.md section 3, "Guan's types"). Each centroid is read as three attention
masses (``type_masses``): *near* = self + the ``near_windows`` nearest windows (keys closer
than ``near_windows * n / 16``), *far* = the other windows, *special* = [CLS] + [SEP] + comma +
period (the three sum to 1). Guan et al. section 4 defines the types by these masses relative
to each other (guan2020_how_far_does_bert_look_at.txt):

* dense: "the heads in this type have the highest attention at long range windows and
  relatively small attention weights to the special tokens": far above every other type's;
  special below dense+vertical's and vertical's;
* diagonal: "Its distance features show large values in the short-range windows and medium
  values in the special tokens": near above every other type's; special between dense's and
  vertical's;
* dense+vertical: "Its distance features have large values at long range windows and special
  tokens": far above diagonal's and vertical's; special above dense's and diagonal's;
* vertical: "Its distance features have large values at special tokens, which are much higher
  than other types": special above every other type's.

Each definition is a list of inequalities between two types' masses (`DEFINITIONS`); the slack
of one is the difference of the two masses. Of the 24 ways to give the four names to the four
clusters, the one whose slacks, sorted ascending, are lexicographically largest (the naming
under which the worst-met inequality is met best, then the next, ...) is chosen. A type's
*margin* is the smallest slack of its own definition (attention mass, 0..1): negative when the
definition is not met (named all the same, as the best naming there is, and flagged), below
``LOW_MARGIN`` (0.02) flagged as a low margin. No name is "the rest": all four are checked.

For k != 4 the clusters are not Guan et al.'s types ("We still get stable clustering results
with 3 or 5 clusters, but the patterns can not be distinguished by human-being"): they are
named "cluster 1" .. "cluster k", ordered by their special mass, largest first.

Cluster ids are renumbered so that their order follows the names in ``CLUSTER_NAMES`` (dense,
diagonal, dense+vertical, vertical): for k = 4, id 0 is always dense, 1 diagonal,
2 dense+vertical, 3 vertical, which makes ids comparable across runs.

Stability: ``stability_fits`` (10) fits of the same procedure (outlier refits included) on
random halves of the heads (``l*h // 2`` heads drawn without replacement, each fit its own
seed), each predicting all heads; each fit's labels are aligned to the full fit's ids by a
Hungarian assignment on the label contingency matrix. Stability = the fraction of heads whose
aligned label is the same in all the fits. None when half the heads are fewer than k.

t-SNE (sklearn, 2-D, PCA init, fixed seed) for the picture; perplexity = min(30, (n - 1) / 3)
so that it stays below the number of heads n; heads fewer than 3 get (0, 0).

Host-only module (numpy, scipy, sklearn, pandas); no jax.
"""

from __future__ import annotations

import itertools

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
MASSES = ("near", "far", "special")          # the columns of `type_masses`
CLUSTER_COLUMNS = contract.CLUSTER_COLUMNS
FEATURES = vocabulary.DISTANCE_FEATURES
_SPECIAL = [FEATURES.index(f) for f in ("cls", "sep", "comma", "period")]
_SELF = FEATURES.index("self")
MIN_SHARE = 0.03       # a cluster with fewer heads than this share is an outlier cluster
MAX_REFITS = 3
LOW_MARGIN = 0.02      # a name whose definition holds by less attention mass is flagged

# Guan et al. section 4's definitions as inequalities (higher type, lower type, mass): the mass
# of the first type exceeds the second's. Each type lists the inequalities its own sentence
# states (an inequality may belong to two types' definitions).
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


def type_masses(centroids, near_windows: int = 2) -> np.ndarray:
  """near, far and special attention mass of each centroid ``[k, d]``: ``[k, 3]`` (`MASSES`)."""
  c = np.asarray(centroids, np.float64)
  if not 1 <= near_windows < 16:
    raise ValueError(f"near_windows must be in 1..15; got {near_windows}")
  near = c[:, _SELF] + c[:, :near_windows].sum(1)
  far = c[:, near_windows:16].sum(1)
  special = c[:, _SPECIAL].sum(1)
  return np.stack([near, far, special], axis=1)


def _slacks(masses: np.ndarray, cluster_of: dict) -> dict:
  """Slack of every inequality of `DEFINITIONS` when type t is cluster ``cluster_of[t]``."""
  col = {m: i for i, m in enumerate(MASSES)}
  return {(hi, lo, m): float(masses[cluster_of[hi], col[m]] - masses[cluster_of[lo], col[m]])
          for hi, lo, m in _ALL_INEQUALITIES}


def name_types(centroids, near_windows: int = 2) -> dict:
  """Guan et al.'s type of each of four centroids (module docstring).

  Returns ``{"names": [4], "margins": [4] (per cluster, of its type's definition), "unmet":
  [4] lists of the inequalities of its type that fail, in words, "masses": [4][3]}``.
  """
  masses = type_masses(centroids, near_windows)
  if masses.shape[0] != len(CLUSTER_NAMES):
    raise ValueError(f"Guan et al.'s four types name four clusters; got {masses.shape[0]}")
  best, best_key = None, None
  for perm in itertools.permutations(range(len(CLUSTER_NAMES))):
    cluster_of = dict(zip(CLUSTER_NAMES, perm))
    key = sorted(_slacks(masses, cluster_of).values())
    if best_key is None or key > best_key:
      best, best_key = cluster_of, key
  slacks = _slacks(masses, best)
  names, margins, unmet = [None] * 4, [None] * 4, [None] * 4
  for t, c in best.items():
    own = {i: slacks[i] for i in DEFINITIONS[t]}
    names[c] = t
    margins[c] = float(min(own.values()))
    unmet[c] = [f"{m} of {hi} ({masses[best[hi], MASSES.index(m)]:.3f}) not above {lo}'s "
                f"({masses[best[lo], MASSES.index(m)]:.3f})" for (hi, lo, m), v in own.items()
                if v <= 0]
  return {"names": names, "margins": margins, "unmet": unmet, "masses": masses.tolist()}


def name_clusters(centroids, near_windows: int = 2) -> list[str]:
  """Names of the k centroids: Guan et al.'s types for k = 4 (`name_types`), else "cluster 1"
  .. "cluster k" by decreasing special mass."""
  centroids = np.asarray(centroids, np.float64)
  if centroids.shape[0] == len(CLUSTER_NAMES):
    return name_types(centroids, near_windows)["names"]
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
              min_share: float = MIN_SHARE, population=None):
  """Fits ``k`` clusters to ``features``, setting outlier clusters aside (module docstring).

  A cluster is an outlier cluster when it holds fewer than ``min_share`` of the ``population``
  heads it predicts (default: ``features`` themselves; the stability's half fits pass all
  heads, so that the rule is the same as the full fit's).

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
    sizes = np.bincount(model.predict(population), minlength=k)
    small = sizes < min_share * population.shape[0]
    drop = np.flatnonzero(keep)[small[model.predict(features[keep])]]
    if not small.any() or refits >= MAX_REFITS or keep.sum() - drop.size < k or drop.size == 0:
      return model, np.asarray(centroids), ~keep, refits
    keep[drop] = False
    refits += 1


def clustering_stability(features, reference, k: int, method: str = "kmeans", seed: int = 0,
                         fits: int = 10, n_init: int = 10,
                         min_share: float = MIN_SHARE) -> float | None:
  """Fraction of heads whose aligned label is the same in all ``fits`` half-sample fits (each
  with `fit_types`' outlier refits).

  Args:
    features: ``[n, d]`` head features.
    reference: int ``[n]`` labels of the full fit (the ids the fits are aligned to).
  """
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
  return float((labels == labels[:1]).all(0).mean())


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
                  tsne: bool = True, min_share: float = MIN_SHARE) -> tuple[pd.DataFrame, dict]:
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
    near_windows: windows counted as "near" for the diagonal name (the rest are "far").
    tsne: compute the t-SNE embedding (else tsne_x = tsne_y = NaN).

  Returns:
    (df, info): df one row per head with exactly ``CLUSTER_COLUMNS`` (layer, head, the 21
    features, cluster, cluster_name, tsne_x, tsne_y); info: method, k, seed, n_init,
    near_windows, feature_names, names (per cluster id), centroids (``[k][d]``), sizes,
    naming (``[k][5]``, columns naming_columns: near, far and special mass of the centroid, the
    name's margin and its flag; k != 4: the masses only), name_margins (``[k]``; k = 4),
    low_margin (names whose margin is below `LOW_MARGIN` or negative), outliers (the heads set
    aside, ``[{layer, head, cluster_name}]``: the type each joined), refits, min_share,
    stability, stability_fits, tsne_perplexity.
  """
  distance = np.asarray(distance)
  l, h = distance.shape[1:3] if distance.ndim == 4 else (0, 0)
  features = head_features(distance)
  n = features.shape[0]
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive integer; got {k!r}")
  if n < k:
    raise ValueError(f"cannot form {k} clusters from {n} heads; use a smaller k")
  model, centroids, outlier, refits = fit_types(features, k, method, seed, n_init, min_share)
  raw = model.predict(features)
  naming = name_types(centroids, near_windows) if k == len(CLUSTER_NAMES) else None
  names = naming["names"] if naming else name_clusters(centroids, near_windows)
  # Renumber: ids ordered by CLUSTER_NAMES (then "cluster 1", ...), ties in the fit's order.
  order = sorted(range(k), key=lambda c: (CLUSTER_NAMES.index(names[c])
                                          if names[c] in CLUSTER_NAMES else 99, names[c], c))
  new_id = np.empty(k, np.int64)
  new_id[order] = np.arange(k)
  labels = new_id[raw]
  centroids = np.asarray(centroids)[order]
  names = [names[c] for c in order]
  masses = type_masses(centroids, near_windows)
  naming_rows = []
  for i, c in enumerate(order):
    row = [float(x) for x in masses[i]]
    if naming:
      margin = naming["margins"][c]
      row += [margin, ("definition not met: " + "; ".join(naming["unmet"][c])) if margin <= 0
              else ("low margin" if margin < LOW_MARGIN else "ok")]
    naming_rows.append(row)

  stability = (clustering_stability(features, labels, k, method, seed, stability_fits, n_init,
                                     min_share) if stability_fits > 0 else None)
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
      "near_windows": int(near_windows), "num_layers": int(l), "num_heads": int(h),
      "feature_names": list(FEATURES), "names": names,
      "centroids": centroids.tolist(), "sizes": np.bincount(labels, minlength=k).tolist(),
      "naming_columns": list(MASSES) + (["margin", "check"] if naming else []),
      "naming": naming_rows,
      "name_margins": [r[3] for r in naming_rows] if naming else None,
      "low_margin": [n for n, r in zip(names, naming_rows) if naming and r[3] < LOW_MARGIN],
      "outliers": [{"layer": int(i // h), "head": int(i % h), "cluster_name": names[labels[i]]}
                   for i in np.flatnonzero(outlier)],
      "refits": int(refits), "min_share": float(min_share),
      "stability": stability, "stability_fits": int(stability_fits),
      "tsne_perplexity": perplexity,
  }
  return df, contract.to_jsonable(info)
