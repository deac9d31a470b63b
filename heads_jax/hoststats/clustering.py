"""Head clustering on distance features (Guan et al. COLING 2020; host, numpy/scipy/sklearn).

Head features: the 21 distance features (order `batch.DISTANCE_FEATURES`: window_0..window_15,
self, cls, sep, comma, period) averaged over sequences, one row per head in (layer, head)
order, ``[l*h, d]``.

Clusters: K-means (default; sklearn, k = 4, ``n_init`` restarts, fixed seed) or a Gaussian
mixture (sklearn, diagonal covariances: 21 features of ~100 heads are too few for full
covariance matrices; the features sum to 1, so a full one would be singular as well).

Names (DESIGN.md section 3), from each cluster's centroid c (for the mixture: its mean):

* vertical score = c[cls] + c[sep] + c[comma] + c[period] (mass on special tokens),
* diagonal score = c[self] + c[window_0] + ... + c[window_{near-1}] (self and the nearest
  windows; ``near_windows`` = 2 by default, i.e. keys closer than n / 8),
* dense score = c[window_near] + ... + c[window_15] (the far windows).

The names vertical, diagonal and dense are assigned by a Hungarian assignment
(`scipy.optimize.linear_sum_assignment`, maximising the summed score) on the ``[k, 3]`` score
matrix, so each of them names one cluster; every other cluster is "dense+vertical" ("the
rest"). For k = 4 each of the four names is used exactly once. For k < 4 the k clusters get k
distinct names among vertical / diagonal / dense (no dense+vertical). For k > 4 the k - 3
clusters left over all get the name dense+vertical (the integer ``cluster`` id stays unique).

Cluster ids are renumbered so that their order follows the names in ``CLUSTER_NAMES`` (dense,
diagonal, dense+vertical, vertical; ties kept in the fit's order): for k = 4, id 0 is always
dense, 1 diagonal, 2 dense+vertical, 3 vertical, which makes ids comparable across runs.

Stability: ``stability_fits`` (10) fits of the same method on random halves of the heads
(``l*h // 2`` heads drawn without replacement, each fit its own seed), each predicting all heads;
each fit's labels are aligned to the full fit's ids by a Hungarian assignment on the label
contingency matrix. Stability = the fraction of heads whose aligned label is the same in all
the fits. None when half the heads are fewer than k.

t-SNE (sklearn, 2-D, PCA init, fixed seed) for the picture; perplexity = min(30, (n - 1) / 3)
so that it stays below the number of heads n; heads fewer than 3 get (0, 0).

Host-only module (numpy, scipy, sklearn, pandas); no jax.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import optimize
from sklearn import cluster as sk_cluster
from sklearn import manifold
from sklearn import mixture

from heads_jax.data import vocabulary as batch_lib
from heads_jax import contract

METHODS = ("kmeans", "gmm")
CLUSTER_NAMES = ("dense", "diagonal", "dense+vertical", "vertical")
PURE_NAMES = ("vertical", "diagonal", "dense")  # the columns of `name_scores`
REST_NAME = "dense+vertical"
CLUSTER_COLUMNS = contract.CLUSTER_COLUMNS
FEATURES = batch_lib.DISTANCE_FEATURES
_SPECIAL = [FEATURES.index(f) for f in ("cls", "sep", "comma", "period")]
_SELF = FEATURES.index("self")


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


def name_scores(centroids, near_windows: int = 2) -> np.ndarray:
  """Score of each centroid ``[k, d]`` for the names vertical, diagonal, dense: ``[k, 3]``."""
  c = np.asarray(centroids, np.float64)
  if not 1 <= near_windows < 16:
    raise ValueError(f"near_windows must be in 1..15; got {near_windows}")
  vertical = c[:, _SPECIAL].sum(1)
  diagonal = c[:, _SELF] + c[:, :near_windows].sum(1)
  dense = c[:, near_windows:16].sum(1)
  return np.stack([vertical, diagonal, dense], axis=1)


def name_clusters(centroids, near_windows: int = 2) -> list[str]:
  """Names of the k centroids (see the module docstring for the rule)."""
  scores = name_scores(centroids, near_windows)
  rows, cols = optimize.linear_sum_assignment(scores, maximize=True)
  names = [REST_NAME] * scores.shape[0]
  for r, c in zip(rows, cols):
    names[r] = PURE_NAMES[c]
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


def clustering_stability(features, reference, k: int, method: str = "kmeans", seed: int = 0,
                         fits: int = 10, n_init: int = 10) -> float | None:
  """Fraction of heads whose aligned label is the same in all ``fits`` half-sample fits.

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
    model, _ = _fit(features[subset], k, method, seed + 1 + i, n_init)
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
                  tsne: bool = True) -> tuple[pd.DataFrame, dict]:
  """Clusters the heads of a run by their mean distance features.

  Args:
    distance: float ``[b, l, h, d]`` (d = 21) per-sequence distance features.
    k: number of clusters (Guan et al.: 4).
    method: "kmeans" or "gmm".
    seed: seed of every fit, of the stability halves and of t-SNE.
    n_init: restarts per fit.
    stability_fits: number of half-sample fits for the stability (0 skips it: None).
    near_windows: windows counted as "near" for the diagonal name (the rest are "far").
    tsne: compute the t-SNE embedding (else tsne_x = tsne_y = NaN).

  Returns:
    (df, info): df one row per head with exactly ``CLUSTER_COLUMNS`` (layer, head, the 21
    features, cluster, cluster_name, tsne_x, tsne_y); info: method, k, seed, n_init,
    near_windows, feature_names, names (per cluster id), centroids (``[k][d]``), sizes,
    name_scores (``[k][3]``, columns name_score_columns), stability, stability_fits,
    tsne_perplexity.
  """
  distance = np.asarray(distance)
  l, h = distance.shape[1:3] if distance.ndim == 4 else (0, 0)
  features = head_features(distance)
  n = features.shape[0]
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be a positive integer; got {k!r}")
  if n < k:
    raise ValueError(f"cannot form {k} clusters from {n} heads; use a smaller k")
  model, centroids = _fit(features, k, method, seed, n_init)
  raw = model.predict(features)
  names = name_clusters(centroids, near_windows)
  # Renumber: ids ordered by CLUSTER_NAMES, ties in the fit's order.
  order = sorted(range(k), key=lambda c: (CLUSTER_NAMES.index(names[c]), c))
  new_id = np.empty(k, np.int64)
  new_id[order] = np.arange(k)
  labels = new_id[raw]
  centroids = np.asarray(centroids)[order]
  names = [names[c] for c in order]

  stability = (clustering_stability(features, labels, k, method, seed, stability_fits, n_init)
               if stability_fits > 0 else None)
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
      "name_score_columns": list(PURE_NAMES),
      "name_scores": name_scores(centroids, near_windows).tolist(),
      "stability": stability, "stability_fits": int(stability_fits),
      "tsne_perplexity": perplexity,
  }
  return df, contract.to_jsonable(info)
