"""Head clustering on planted distance features (Guan et al.)."""
import numpy as np
import pytest

from heads_jax.data import vocabulary as batch_lib
from heads_jax import contract
from heads_jax.hoststats import clustering

F = batch_lib.DISTANCE_FEATURES


def _prototypes():
  """Distance-feature prototypes of the four head types (each sums to 1)."""
  p = {}
  v = np.zeros(21)
  v[[F.index("cls"), F.index("sep"), F.index("comma"), F.index("period")]] = [0.5, 0.4, 0.05, 0.05]
  p["vertical"] = v
  d = np.zeros(21)
  d[[F.index("self"), 0, 1]] = [0.5, 0.35, 0.15]
  p["diagonal"] = d
  p["dense"] = np.r_[np.full(16, 1 / 16), np.zeros(5)]
  dv = np.r_[np.full(16, 0.5 / 16), np.zeros(5)]
  dv[[F.index("cls"), F.index("sep")]] = [0.3, 0.2]
  p["dense+vertical"] = dv
  return p


def _planted(per=10, b=3, noise=0.01, seed=0):
  """distance [b, 4, per, 21] with `per` heads of each type shuffled over 4 layers."""
  rng = np.random.default_rng(seed)
  protos = _prototypes()
  names = np.array(list(protos))
  truth = np.repeat(np.arange(4), per)
  rng.shuffle(truth)
  x = np.stack([protos[n] for n in names[truth]])[None] + rng.normal(0, noise, (b, 4 * per, 21))
  x = np.abs(x)
  x /= x.sum(-1, keepdims=True)
  return x.reshape(b, 4, per, 21), names[truth]


def test_head_features_mean_over_sequences():
  x = np.zeros((2, 1, 2, 21))
  x[0, 0, 0, 0], x[1, 0, 0, 0] = 1.0, 0.0
  x[0, 0, 0, 1], x[1, 0, 0, 1] = 0.0, 1.0
  x[:, 0, 1, 16] = 1.0
  x[1, 0, 1, 16] = np.nan  # left out of the mean
  features = clustering.head_features(x)
  assert features.shape == (2, 21)
  np.testing.assert_allclose(features[0, :2], [0.5, 0.5])
  np.testing.assert_allclose(features[1, 16], 1.0)
  with pytest.raises(ValueError, match="21"):
    clustering.head_features(np.zeros((2, 1, 2, 20)))


def test_name_clusters_rule():
  protos = _prototypes()
  order = ["dense+vertical", "vertical", "dense", "diagonal"]
  assert clustering.name_clusters(np.stack([protos[n] for n in order])) == order
  # k = 3: three distinct pure names, no dense+vertical.
  assert clustering.name_clusters(np.stack([protos[n] for n in ("dense", "vertical", "diagonal")])
                                  ) == ["dense", "vertical", "diagonal"]
  # k = 5: the two clusters left over after the Hungarian assignment are both dense+vertical.
  five = ["vertical", "dense+vertical", "diagonal", "dense", "dense+vertical"]
  centroids = np.stack([protos[n] for n in five])
  centroids[4] = 0.5 * protos["dense"] + 0.5 * protos["vertical"]
  assert clustering.name_clusters(centroids) == five
  scores = clustering.name_scores(protos["diagonal"][None])
  np.testing.assert_allclose(scores, [[0.0, 1.0, 0.0]])


def test_align_labels():
  reference = np.array([0, 0, 1, 1, 2, 2, 3])
  permuted = np.array([2, 2, 3, 3, 0, 1, 1])  # 3 -> 1, 2 -> 0, 0 -> 2, 1 -> 3 (one disagreement)
  np.testing.assert_array_equal(clustering.align_labels(permuted, reference, 4),
                                [0, 0, 1, 1, 2, 3, 3])


@pytest.mark.parametrize("method", ["kmeans", "gmm"])
def test_recovers_planted_groups_and_names(method):
  x, truth = _planted()
  df, info = clustering.cluster_heads(x, method=method, n_init=2, tsne=False)
  assert list(df.columns) == list(contract.CLUSTER_COLUMNS)
  assert len(df) == 40
  np.testing.assert_array_equal(df["cluster_name"].to_numpy(), truth)
  assert info["names"] == ["dense", "diagonal", "dense+vertical", "vertical"]  # id order
  np.testing.assert_array_equal(df["cluster"].to_numpy(),
                                [info["names"].index(n) for n in truth])
  assert info["sizes"] == [10, 10, 10, 10]
  assert info["stability"] == 1.0
  assert info["method"] == method and info["k"] == 4
  np.testing.assert_allclose(df[list(F)].to_numpy(), clustering.head_features(x))
  assert df["layer"].tolist()[:11] == [0] * 10 + [1] and df["head"].tolist()[:11] == list(
      range(10)) + [0]
  centroids = np.asarray(info["centroids"])
  features = df[list(F)].to_numpy()
  for c in range(4):  # ids renumbered together with their centroids
    np.testing.assert_allclose(centroids[c], features[df["cluster"] == c].mean(0), atol=1e-3)
  assert np.argmax(np.asarray(info["name_scores"])[3]) == 0  # vertical: special-token mass
  assert df["tsne_x"].isna().all()


def test_tsne_and_stability_on_small_runs():
  x, _ = _planted(per=1, b=2)  # 4 heads: half-fits of 2 heads cannot make 4 clusters
  df, info = clustering.cluster_heads(x, n_init=2)
  assert np.isfinite(df[["tsne_x", "tsne_y"]].to_numpy()).all()
  assert info["tsne_perplexity"] == pytest.approx(1.0)  # (4 - 1) / 3, below the 4 heads
  assert info["stability"] is None
  assert sorted(df["cluster_name"]) == sorted(clustering.CLUSTER_NAMES)
  with pytest.raises(ValueError, match="cannot form 5 clusters from 4 heads"):
    clustering.cluster_heads(x, k=5)
  with pytest.raises(ValueError, match="method"):
    clustering.cluster_heads(x, method="dbscan")


def test_stability_on_a_controlled_half_stable_case(monkeypatch):
  """40 heads, 4 reference clusters. Every half-sample fit returns its own permutation of the
  cluster ids (alignment must undo it); heads 0-19 always land in their reference cluster,
  heads 20-29 move to another cluster in fit 3 only, heads 30-39 in every odd fit. Stability =
  the share of heads with the same aligned label in all fits = 20 / 40 exactly."""
  n, k, fits = 40, 4, 6
  reference = np.arange(n) % k
  features = np.arange(n, dtype=np.float64)[:, None] * np.ones((1, 21))  # row j identifies head j
  calls = []

  class Fake:
    def __init__(self, i):
      self.i = i

    def predict(self, x):
      heads = x[:, 0].astype(int)
      label = reference[heads].copy()
      moved = ((heads >= 20) & (heads < 30) & (self.i == 3)) | ((heads >= 30) & (self.i % 2 == 1))
      label[moved] = (label[moved] + 1 + heads[moved] % 3) % k   # spread over the other ids
      return np.random.default_rng(self.i).permutation(k)[label]

  def fake_fit(x, k_, method, seed, n_init):
    calls.append((np.asarray(x).copy(), k_, method, seed))
    return Fake(len(calls) - 1), None

  monkeypatch.setattr(clustering, "_fit", fake_fit)
  got = clustering.clustering_stability(features, reference, k, "gmm", seed=5, fits=fits, n_init=3)
  assert got == 0.5
  assert len(calls) == fits
  for x, k_, method, seed in calls:                     # halves drawn without replacement
    assert x.shape == (n // 2, 21) and len(set(x[:, 0])) == n // 2
    assert (k_, method) == (k, "gmm")
  assert len({tuple(sorted(x[:, 0])) for x, *_ in calls}) == fits   # a new half every fit
  assert len({seed for *_, seed in calls}) == fits                  # and its own seed
  calls.clear()
  assert clustering.clustering_stability(features, reference, k, fits=3) == 0.75  # fits 0-2
  assert clustering.clustering_stability(features, reference, k, fits=1) == 1.0
  assert clustering.clustering_stability(features[:7], reference[:7], k) is None  # 3 < k
  assert clustering.clustering_stability(features[:8], reference[:8], k, fits=2) == 1.0  # 4 = k


def test_stability_on_real_fits():
  """Tight planted clusters are stable (1.0); structureless features are not."""
  x, _ = _planted(per=6, b=1, noise=0.002)
  _, info = clustering.cluster_heads(x, n_init=2, tsne=False, stability_fits=4)
  assert info["stability"] == 1.0 and info["stability_fits"] == 4
  rng = np.random.default_rng(0)
  noise = rng.dirichlet(np.ones(21), (1, 4, 10))  # 40 heads, no cluster structure
  _, info = clustering.cluster_heads(noise, n_init=2, tsne=False)
  assert 0.0 <= info["stability"] < 0.9
