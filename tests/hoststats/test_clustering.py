"""Head clustering on planted distance features (Guan et al.)."""
import numpy as np
import pytest

from heads_jax.data import vocabulary
from heads_jax import contract
from heads_jax.hoststats import clustering

F = vocabulary.DISTANCE_FEATURES


def _prototypes():
  """Distance-feature prototypes of the four head types (each sums to 1)."""
  p = {}
  v = np.zeros(21)
  v[[F.index("cls"), F.index("sep"), F.index("comma"), F.index("period")]] = [0.5, 0.4, 0.05, 0.05]
  p["vertical"] = v
  d = np.zeros(21)
  d[[F.index("self"), 0, 1, F.index("cls"), F.index("sep")]] = [0.4, 0.3, 0.1, 0.1, 0.1]
  p["diagonal"] = d          # "medium values in the special tokens"
  p["dense"] = np.r_[np.full(16, 0.95 / 16), 0.0, 0.03, 0.02, 0.0, 0.0]
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


def _masses_proto(near, far, special):
  """A centroid with the given near / far / special masses (near_windows = 2)."""
  v = np.zeros(21)
  v[[F.index("self"), 0, 1]] = [near / 2, near / 4, near / 4]
  v[2:16] = far / 14
  v[[F.index("cls"), F.index("sep")]] = [0.6 * special, 0.4 * special]
  return v


def test_names_follow_guan_definitions():
  protos = _prototypes()
  order = ["dense+vertical", "vertical", "dense", "diagonal"]
  got = clustering.name_types(np.stack([protos[n] for n in order]))
  assert got["names"] == order and all(m > clustering.LOW_MARGIN for m in got["margins"])
  assert got["unmet"] == [[], [], [], []]
  np.testing.assert_allclose(clustering.type_masses(protos["diagonal"][None]), [[0.8, 0.0, 0.2]])
  # The audit's case (issue 31): a cluster with near 0.44, far 0.12 (the lowest) and special 0.44
  # is Guan's diagonal ("large values in the short-range windows and medium values in the special
  # tokens"), one with far 0.26 and special 0.49 their dense&vertical, whatever the sizes.
  audit = np.stack([_masses_proto(.30, .55, .15), _masses_proto(.44, .12, .44),
                    _masses_proto(.25, .26, .49), _masses_proto(.08, .07, .85)])
  got = clustering.name_types(audit)
  assert got["names"] == ["dense", "diagonal", "dense+vertical", "vertical"]
  np.testing.assert_allclose(got["margins"], [0.29, 0.14, 0.05, 0.36], atol=1e-9)
  # k != 4: not Guan's types; named by decreasing special mass
  three = np.stack([protos[n] for n in ("dense", "vertical", "diagonal")])
  assert clustering.name_clusters(three) == ["cluster 3", "cluster 1", "cluster 2"]


@pytest.mark.parametrize("broken", list(clustering.CLUSTER_NAMES))
def test_every_definition_is_checked(broken):
  """Each type's definition can fail: centroids where one inequality of that type's sentence
  is reversed get a negative margin, the flag, and the failed inequality in words."""
  masses = {"dense": [.25, .65, .10], "diagonal": [.70, .05, .25],
            "dense+vertical": [.15, .40, .45], "vertical": [.10, .05, .85]}
  if broken == "dense":          # "relatively small attention weights to the special tokens"
    masses["dense"] = [.05, .45, .50]
  elif broken == "diagonal":     # "medium values in the special tokens": above dense's
    masses["diagonal"] = [.85, .10, .05]
  elif broken == "dense+vertical":   # "large values at long range windows": above vertical's
    masses["dense+vertical"] = [.45, .04, .51]
  else:                          # "much higher than other types"
    masses["vertical"] = [.50, .06, .44]
  names = list(clustering.CLUSTER_NAMES)
  got = clustering.name_types(np.stack([_masses_proto(*masses[n]) for n in names]))
  bad = [n for n, m in zip(got["names"], got["margins"]) if m <= 0]
  assert broken in bad, (got["names"], got["margins"])
  i = got["names"].index(broken)
  assert got["unmet"][i] and all(" not above " in u for u in got["unmet"][i])
  for n, m, u in zip(got["names"], got["margins"], got["unmet"]):
    assert (m <= 0) == bool(u)


def _hand_built_attention(types, n=32, seed=0, b=2):
  """Attention maps ``[b, 1, len(types), n, n]`` built to match Guan et al.'s descriptions of each
  type, with the token classes of a two-segment input ([CLS] at 0, [SEP] at 15 and 31, commas
  at 7 and 23, periods at 14 and 30)."""
  rng = np.random.default_rng(seed)
  token_class = np.zeros(n, np.int32)
  token_class[0] = vocabulary.TOKEN_CLS
  token_class[[15, 31]] = vocabulary.TOKEN_SEP
  token_class[[7, 23]] = vocabulary.TOKEN_COMMA
  token_class[[14, 30]] = vocabulary.TOKEN_PERIOD
  special = token_class != vocabulary.TOKEN_OTHER
  delim = np.isin(token_class, (vocabulary.TOKEN_CLS, vocabulary.TOKEN_SEP))
  pos = np.arange(n)
  attn = np.zeros((b, 1, len(types), n, n))
  for i, t in enumerate(types):
    for s in range(b):
      w = rng.uniform(-0.04, 0.04)
      for q in range(n):
        other = ~special & (pos != q)
        uniform = other / other.sum()
        to_delim = delim / delim.sum()
        to_special = special / special.sum()
        if t == "dense":       # spread over all keys, little on special tokens
          row = (0.95 + w) * uniform + (0.05 - w) * to_special
        elif t == "diagonal":  # itself and the nearest tokens, some vertical stripes
          near = ~special & (np.abs(pos - q) <= 2) & (pos != q)
          row = 0.45 * (pos == q) + (0.30 + w) * near / max(near.sum(), 1) + (0.25 - w) * to_special
        elif t == "dense+vertical":   # dense and vertical mixed
          row = (0.5 + w) * uniform + (0.5 - w) * to_delim
        else:                  # vertical: mostly [CLS] / [SEP]
          row = (0.1 + w) * uniform + (0.9 - w) * to_delim
        attn[s, 0, i, q] = row / row.sum()
  mask = np.ones((b, n), np.int32)
  return attn, np.tile(token_class, (b, 1)), mask


def test_hand_built_heads_through_the_distance_features():
  """Attention maps constructed to each description, through the real distance-feature code,
  cluster into the four types with the right names and clear margins."""
  from heads_jax.stats.distance import distance_features
  rng = np.random.default_rng(1)
  truth = np.repeat(np.array(clustering.CLUSTER_NAMES), 6)
  rng.shuffle(truth)
  attn, token_class, mask = _hand_built_attention(list(truth))
  distance = np.asarray(distance_features(attn, token_class, mask))      # [b, 1, 24, 21]
  np.testing.assert_allclose(distance.sum(-1), 1.0, atol=1e-5)
  distance = distance.reshape(2, 4, 6, 21)                                # 4 layers x 6 heads
  df, info = clustering.cluster_heads(distance, n_init=4, tsne=False, stability_fits=0)
  np.testing.assert_array_equal(df["cluster_name"].to_numpy(), truth)
  assert info["names"] == list(clustering.CLUSTER_NAMES)
  assert info["naming_columns"] == ["near", "far", "special", "margin", "check"]
  assert [r[4] for r in info["naming"]] == ["ok"] * 4 and info["low_margin"] == []
  assert min(info["name_margins"]) > 0.05
  assert info["outliers"] == [] and info["refits"] == 0


def test_an_outlier_head_is_set_aside_and_joins_its_nearest_type():
  """Plain K-means spends a cluster on one extreme head (dense and dense+vertical then share
  one); the outlier rule sets it aside, refits, names the four types and joins it to diagonal."""
  protos = _prototypes()
  protos["dense+vertical"] = 0.75 * protos["dense"] + 0.25 * protos["vertical"]
  names = np.array(list(protos))
  rng = np.random.default_rng(0)
  truth = np.repeat(np.arange(4), 10)
  x = np.stack([protos[n] for n in names[truth]]) + rng.normal(0, 0.004, (40, 21))
  x = np.abs(x)
  outlier = np.zeros(21)
  outlier[F.index("self")] = 1.0                         # a head that only attends to itself
  x = np.vstack([x, outlier])
  x /= x.sum(-1, keepdims=True)
  truth_names = list(names[truth]) + ["diagonal"]
  # the premise: K-means (k = 4) isolates the single head
  _, centroids = clustering._fit(x, 4, "kmeans", 0, 10)
  plain = np.bincount(np.argmin(((x[:, None] - centroids[None]) ** 2).sum(-1), 1), minlength=4)
  assert sorted(plain)[0] == 1
  df, info = clustering.cluster_heads(x.reshape(1, 1, 41, 21), n_init=10, tsne=False,
                                      stability_fits=2)
  assert info["refits"] == 1
  assert info["outliers"] == [{"layer": 0, "head": 40, "cluster_name": "diagonal"}]
  assert df["cluster_name"].tolist() == truth_names
  assert sorted(info["sizes"]) == [10, 10, 10, 11]
  assert info["stability"] == 1.0
  # without the rule (min_share 0) the single head is a "type" of its own
  _, raw = clustering.cluster_heads(x.reshape(1, 1, 41, 21), n_init=10, tsne=False,
                                    stability_fits=0, min_share=0.0)
  assert 1 in raw["sizes"] and raw["outliers"] == []


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
  assert np.argmax(np.asarray(info["naming"])[3, :3].astype(float)) == 2  # vertical: special mass
  assert df["tsne_x"].isna().all()


def test_tsne_and_stability_on_small_runs():
  x, _ = _planted(per=1, b=2)  # 4 heads: half-fits of 2 heads cannot make 4 clusters
  df, info = clustering.cluster_heads(x, n_init=2)
  assert np.isfinite(df[["tsne_x", "tsne_y"]].to_numpy()).all()
  assert info["tsne_perplexity"] == pytest.approx(1.0)  # (4 - 1) / 3, below the 4 heads
  assert info["stability"] is None
  assert sorted(df["cluster_name"]) == sorted(clustering.CLUSTER_NAMES)
  assert info["refits"] == 0         # 1 head of 4 is 25%: no outlier cluster
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
