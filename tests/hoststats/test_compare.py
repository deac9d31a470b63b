"""Before/after comparison on synthetic runs with planted changes."""
import numpy as np
import pandas as pd
import pytest

from heads_jax import contract
from heads_jax.hoststats import compare

ROLES = ("local", "cls", "syntactic")
L, H, N = 6, 2, 4
# planted change of the sieve bias per (role, layer group): after = before + delta
DELTA = {("local", "initial"): 1.0, ("local", "middle"): 0.0, ("local", "final"): -0.5,
         ("cls", "initial"): 0.25, ("cls", "middle"): 2.0, ("cls", "final"): 3.0,
         ("syntactic", "initial"): -1.0, ("syntactic", "middle"): 0.5, ("syntactic", "final"): 0.0}
GROUP = ["initial"] * 2 + ["middle"] * 2 + ["final"] * 2


def _sieve_bias(after: bool, seed=0):
  rng = np.random.default_rng(seed)
  sb = rng.normal(2.0, 0.5, (N, L, H, len(ROLES)))
  sb[1, :, :, 2] = np.nan  # an empty syntactic sieve, in both runs
  if after:
    for r, role in enumerate(ROLES):
      for layer in range(L):
        sb[:, layer, :, r] += DELTA[(role, GROUP[layer])]
  return sb.astype(np.float32)


def _tests(assigned: dict, roles=ROLES):
  rows = [[l, h, r, 1.0, N, 0.0, 0.5, 0.5, r in assigned.get((l, h), ())]
          for l in range(L) for h in range(H) for r in roles]
  return pd.DataFrame(rows, columns=list(contract.TEST_COLUMNS))


def _clusters(names):
  rows = [[l, h] + [1 / 21] * 21 + [0, names[(l, h)], 0.0, 0.0] for l in range(L) for h in range(H)]
  return pd.DataFrame(rows, columns=list(contract.CLUSTER_COLUMNS))


def _write_run(path, after, settings=None, roles=ROLES, assigned=None, clusters=None, n=N):
  sb = _sieve_bias(after)[:n]
  if roles != ROLES:
    sb = sb[..., [ROLES.index(r) for r in roles]]
  contract.write_scores(path, sb, roles, lengths=np.full(n, 9))
  base = {"tau": 3.0, "alpha": 0.05, "data": "ud_ewt_test", "model": "after" if after else "before"}
  contract.write_tests(_tests(assigned or {}, roles), {**base, **(settings or {})}, path)
  if clusters is not None:
    contract.write_clusters(_clusters(clusters), {"k": 4}, path)
  return path


BEFORE_ROLES = {(0, 0): {"local", "cls"}, (5, 1): {"syntactic"}}
AFTER_ROLES = {(0, 0): {"cls"}, (5, 1): {"syntactic", "local"}, (3, 0): {"cls"}}


def _pair(tmp_path, **after_kwargs):
  names = {(l, h): "dense" for l in range(L) for h in range(H)}
  changed = dict(names)
  changed[(2, 1)] = "vertical"
  before = _write_run(tmp_path / "before", False, assigned=BEFORE_ROLES, clusters=names)
  kwargs = {"assigned": AFTER_ROLES, "clusters": changed, **after_kwargs}
  after = _write_run(tmp_path / "after", True, **kwargs)
  return before, after


def test_planted_sieve_bias_deltas(tmp_path):
  before, after = _pair(tmp_path)
  result = compare.compare_runs(before, after)
  assert result.warnings == []
  table = result.sieve_bias
  assert list(table.columns) == ["role", "layer_group", "before", "after", "delta", "heads",
                                 "delta_low", "delta_high", "p_value"]
  # every head moves by the planted delta (up to float32 rounding): p 1 without a change, about
  # 0 with one; 4 heads a third
  for _, row in table.iterrows():
    assert row["heads"] == 4
    assert row["delta_low"] == pytest.approx(row["delta"], abs=1e-5)
    if DELTA[(row["role"], row["layer_group"])] == 0:
      assert row["p_value"] == 1.0
    else:
      assert row["p_value"] < 1e-6
  assert len(table) == 9
  sb = _sieve_bias(False).astype(np.float64)
  for _, row in table.iterrows():
    assert row["delta"] == pytest.approx(DELTA[(row["role"], row["layer_group"])], abs=1e-5)
    layers = [i for i, g in enumerate(GROUP) if g == row["layer_group"]]
    want = np.nanmean(sb[:, layers, :, ROLES.index(row["role"])])
    assert row["before"] == pytest.approx(want, rel=1e-12)
  assert table["layer_group"].tolist()[:3] == ["initial", "middle", "final"]


def test_a_change_is_tested_over_heads():
  """Issue 52 item 4: the heads are the units. Changes 1, 2, 3: mean 2, sd 1, t = 2 sqrt 3 on 2
  degrees of freedom, whose two-sided p is 1 - t / sqrt(t^2 + 2) (Student's t with 2 degrees of
  freedom in closed form) and whose 97.5% point solves t / sqrt(t^2 + 2) = 0.95."""
  out = compare.change_test([1.0, 2.0, np.nan, 3.0])
  t = 2 * np.sqrt(3)
  assert out["heads"] == 3
  assert out["p_value"] == pytest.approx(1 - t / np.sqrt(t * t + 2))                # 0.074
  q = np.sqrt(0.95 ** 2 * 2 / (1 - 0.95 ** 2))                                      # 4.303
  assert (out["delta_low"], out["delta_high"]) == (pytest.approx(2 - q / np.sqrt(3)),
                                                   pytest.approx(2 + q / np.sqrt(3)))
  assert np.isnan(compare.change_test([1.0])["p_value"])
  # per head: the mean over the sequences first (nested values are not the units)
  before = np.zeros((5, 3, 1, 1))
  after = before.copy()
  after[:, :, 0, 0] = [[1.0, 2.0, 3.0]] * 5          # 3 layers, one head each, one role
  after[0, 0, 0, 0] = np.nan
  table = compare.sieve_bias_change(before, after, ["local"])
  assert table["heads"].tolist() == [1, 1, 1] and table["p_value"].isna().all()


def test_planted_role_and_cluster_changes(tmp_path):
  result = compare.compare_runs(*_pair(tmp_path))
  roles = result.roles
  assert list(roles.columns) == ["layer", "head", "roles_before", "roles_after", "gained", "lost"]
  assert len(roles) == L * H

  def row(l, h):
    return roles[(roles["layer"] == l) & (roles["head"] == h)].iloc[0]
  assert row(0, 0)[["roles_before", "roles_after", "gained", "lost"]].tolist() == [
      "local;cls", "cls", "", "local"]
  assert row(5, 1)[["gained", "lost"]].tolist() == ["local", ""]
  assert row(5, 1)["roles_after"] == "local;syntactic"  # run's role order
  assert row(3, 0)[["gained", "lost"]].tolist() == ["cls", ""]
  assert (roles["gained"] != "").sum() == 2 and (roles["lost"] != "").sum() == 1
  clusters = result.clusters
  assert list(clusters.columns) == ["layer", "head", "cluster_before", "cluster_after", "changed"]
  assert clusters["changed"].sum() == 1
  hit = clusters[clusters["changed"]].iloc[0]
  assert (hit["layer"], hit["head"], hit["cluster_before"], hit["cluster_after"]) == (
      2, 1, "dense", "vertical")


def test_write_and_read_comparison(tmp_path):
  result = compare.compare_runs(*_pair(tmp_path))
  paths = contract.write_comparison(result, tmp_path / "cmp")
  assert set(paths) == {"compare_sieve_bias.csv", "compare_roles.csv", "compare_clusters.csv",
                        "compare.json"}
  back = contract.read_comparison(tmp_path / "cmp")
  pd.testing.assert_frame_equal(back.sieve_bias, result.sieve_bias)
  pd.testing.assert_frame_equal(back.roles, result.roles)
  pd.testing.assert_frame_equal(back.clusters, result.clusters)
  assert back.settings_before["model"] == "before"


def test_no_clusters_when_only_one_run_has_them(tmp_path):
  before, after = _pair(tmp_path, clusters=None)
  with pytest.warns(UserWarning, match="only one run"):
    result = compare.compare_runs(before, after)
  assert result.clusters is None


def test_settings_differ_warns(tmp_path):
  before, after = _pair(tmp_path, settings={"tau": 2.0})
  with pytest.warns(UserWarning, match="'tau' differs.*same inputs"):
    result = compare.compare_runs(before, after)
  assert len(result.warnings) == 1  # the model differs by design: no warning for it


def test_roles_of_one_run_only_are_left_out(tmp_path):
  before, after = _pair(tmp_path, roles=("local", "cls"))
  with pytest.warns(UserWarning, match="only one run.*syntactic"):
    result = compare.compare_runs(before, after)
  assert set(result.sieve_bias["role"]) == {"local", "cls"}
  assert "syntactic" not in ";".join(result.roles["roles_before"])


def test_different_data_is_an_error(tmp_path):
  before, after = _pair(tmp_path, n=3)
  with pytest.raises(ValueError, match="different data: 4 sequences before, 3 after"):
    compare.compare_runs(before, after)
  before, after = _pair(tmp_path / "b", settings={"data": "glue_mrpc"})
  with pytest.raises(ValueError, match="different data: data"):
    compare.compare_runs(before, after)
  contract.write_scores(after, _sieve_bias(True), ROLES, lengths=np.full(N, 7))
  with pytest.raises(ValueError, match="lengths differ"):
    compare.compare_runs(before, after)


def test_different_architecture_is_an_error(tmp_path):
  before, after = _pair(tmp_path)
  contract.write_scores(after, _sieve_bias(True)[:, :4], ROLES, lengths=np.full(N, 9))
  with pytest.raises(ValueError, match="different architectures: before 6 layers x 2 heads, "
                     "after 4 x 2"):
    compare.compare_runs(before, after)
