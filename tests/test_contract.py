"""Contract files: scores.npz, tests.csv/json, settings.json, clusters.csv/json round trips."""
import json

import numpy as np
import pandas as pd
import pytest

from heads_jax.data import vocabulary
from heads_jax import contract
from heads_jax.hoststats import hypothesis


def _scores(b=4, l=2, h=3, roles=("local", "cls", "syntactic"), seed=0):
  rng = np.random.default_rng(seed)
  sb = rng.normal(3, 1, (b, l, h, len(roles))).astype(np.float32)
  sb[0, :, :, 2] = np.nan
  distance = rng.dirichlet(np.ones(21), (b, l, h)).astype(np.float32)
  return sb, roles, distance, np.arange(5, 5 + b)


def test_scores_round_trip(tmp_path):
  sb, roles, distance, lengths = _scores()
  path = contract.write_scores(tmp_path, sb, roles, distance, lengths)
  assert path == tmp_path / "scores.npz"
  for where in (tmp_path, path):
    s = contract.read_scores(where)
    np.testing.assert_array_equal(s.sieve_bias, sb)
    np.testing.assert_array_equal(s.distance, distance)
    np.testing.assert_array_equal(s.lengths, lengths)
    assert s.roles == roles
    assert (s.num_sequences, s.num_layers, s.num_heads) == (4, 2, 3)


def test_read_scores_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="scores.npz"):
    contract.read_scores(tmp_path)
  np.savez(tmp_path / "scores.npz", sieve_bias=np.zeros((1, 1, 1, 2), np.float32))
  with pytest.raises(ValueError, match="roles"):
    contract.read_scores(tmp_path)
  np.savez(tmp_path / "scores.npz", sieve_bias=np.zeros((1, 1, 1, 2), np.float32),
           roles=np.array(["local"]))
  with pytest.raises(ValueError, match="must match the last axis"):
    contract.read_scores(tmp_path)
  sb, roles, distance, _ = _scores()
  with pytest.raises(ValueError, match="distance"):
    contract.write_scores(tmp_path, sb, roles, distance[:, :1])
  with pytest.raises(ValueError, match="infinite"):
    contract.write_scores(tmp_path, np.full((1, 1, 1, 1), np.inf, np.float32), ("local",))


def test_tests_round_trip(tmp_path):
  x = np.array([[4.0, np.nan, 1.0], [4.0, np.nan, 2.0], [4.0, 7.0, 3.0]]).reshape(3, 1, 1, 3)
  df, settings = hypothesis.hypothesis_tests(x, ("local", "cls", "sep"),
                                             settings={"model": "bert", "max_length": 128})
  paths = contract.write_tests(df, settings, tmp_path)
  assert set(paths) == {"tests.csv", "tests.json", "settings.json"}
  first = (tmp_path / "tests.csv").read_text().splitlines()[0]
  assert first == "layer,head,role,mean,n,statistic,p_value,p_adjusted,assigned"
  back, back_settings = contract.read_tests(tmp_path)
  pd.testing.assert_frame_equal(back, df, check_dtype=False)
  assert back["assigned"].dtype == bool
  assert back.loc[0, "statistic"] == np.inf  # zero variance above tau survives the CSV
  assert back_settings == json.loads(json.dumps(contract.to_jsonable(settings)))
  assert back_settings["max_length"] == 128 and back_settings["tau"] == 3.0
  doc = json.loads((tmp_path / "tests.json").read_text())  # strict JSON: NaN/inf are null
  assert doc["settings"]["model"] == "bert"
  assert doc["tests"][0]["statistic"] is None and doc["tests"][1]["p_value"] is None
  assert doc["tests"][2]["role"] == "sep" and doc["tests"][2]["n"] == 3
  with pytest.raises(ValueError, match="exactly the columns"):
    contract.write_tests(df.drop(columns=["n"]), settings, tmp_path)


def test_read_tests_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match="tests.csv"):
    contract.read_tests(tmp_path)


def test_clusters_round_trip(tmp_path):
  cols = list(contract.CLUSTER_COLUMNS)
  assert cols[2:23] == list(vocabulary.DISTANCE_FEATURES)
  rows = [[0, h] + [1 / 21] * 21 + [h % 2, ["dense", "diagonal"][h % 2], 0.5 * h, -h]
          for h in range(3)]
  df = pd.DataFrame(rows, columns=cols)
  contract.write_clusters(df, {"k": 2, "stability": np.float64(1.0), "names": ("dense", "diagonal")},
                    tmp_path)
  back, info = contract.read_clusters(tmp_path)
  pd.testing.assert_frame_equal(back, df, check_dtype=False)
  assert info == {"k": 2, "stability": 1.0, "names": ["dense", "diagonal"]}


def test_to_jsonable():
  out = contract.to_jsonable({"a": np.float32(1.5), "b": (np.int64(2), np.nan), "c": np.array([True])})
  assert out == {"a": 1.5, "b": [2, None], "c": [True]}
  with pytest.raises(TypeError, match="JSON"):
    contract.to_jsonable({"x": object()})


def test_scores_npz_keys_dtypes_and_data_index(tmp_path):
  """The raw file: exactly the contract keys, float32 / int32, roles as strings; data_index is
  additive and round-trips; lengths must be integers."""
  sb, roles, distance, lengths = _scores()
  path = contract.write_scores(tmp_path / "out" / "scores.npz", sb.astype(np.float64), roles,
                               distance, lengths)
  with np.load(path, allow_pickle=False) as raw:
    assert raw.files == ["sieve_bias", "roles", "distance", "lengths"]
    assert raw["sieve_bias"].dtype == np.float32 and raw["distance"].dtype == np.float32
    assert raw["lengths"].dtype == np.int32 and raw["roles"].tolist() == list(roles)
  assert not list((tmp_path / "out").glob("*.tmp"))  # written atomically
  contract.write_scores(tmp_path, sb, roles, distance, lengths, data_index=[0, 0, 1, 1])
  back = contract.read_scores(tmp_path)
  assert back.data_index.tolist() == [0, 0, 1, 1] and back.data_index.dtype == np.int32
  assert contract.read_scores(path).data_index is None
  with pytest.raises(ValueError, match="lengths must be integer"):
    contract.write_scores(tmp_path, sb, roles, distance, lengths + 0.5)
  with pytest.raises(ValueError, match="data_index must have shape"):
    contract.write_scores(tmp_path, sb, roles, distance, lengths, data_index=[0, 1])


def _measures(b=3, l=2, h=2, seed=0):
  rng = np.random.default_rng(seed)
  return {"entropy": rng.random((b, l, h)), "cls_entropy": rng.random((b, l, h)),
          "token_attention": rng.random((b, l, h, 5)), "lengths": np.array([4, 5, 6]),
          "js": rng.random((l * h, l * h)), "js_sequences": b, "data_index": np.array([0, 1, 1])}


def test_measures_round_trip(tmp_path):
  m = _measures()
  path = contract.write_measures(tmp_path, m)
  assert path == tmp_path / "measures.npz"
  back = contract.read_measures(path)
  assert back["token_measures"] == contract.TOKEN_MEASURES == ("cls", "sep", "punct", "prev", "next")
  for key in ("entropy", "cls_entropy", "token_attention", "js"):
    assert back[key].dtype == np.float32
    np.testing.assert_allclose(back[key], m[key], rtol=1e-6)
  assert back["lengths"].tolist() == [4, 5, 6] and int(back["js_sequences"]) == 3
  assert back["data_index"].tolist() == [0, 1, 1]
  with pytest.raises(ValueError, match="token_attention"):
    contract.write_measures(tmp_path, m | {"token_attention": m["token_attention"][..., :4]})
  with pytest.raises(FileNotFoundError, match="measures"):
    contract.read_measures(tmp_path / "nothing")


def test_run_summary_and_bad_json(tmp_path):
  assert contract.read_run(tmp_path) is None
  contract.write_run(tmp_path, {"model": "m", "data": ["ud-ewt"]}, [{"arcs": "gold"}])
  assert contract.read_run(tmp_path) == {"device": {"model": "m", "data": ["ud-ewt"]},
                                         "data_info": [{"arcs": "gold"}]}
  with pytest.raises(FileNotFoundError, match="summary.json"):
    contract.read_summary(tmp_path)
  contract.write_summary({"share_local": np.float64(0.25), "rho": np.nan}, tmp_path)
  assert contract.read_summary(tmp_path) == {"share_local": 0.25, "rho": None}
  (tmp_path / "summary.json").write_text("{not json")
  with pytest.raises(ValueError, match="summary.json is not valid JSON"):
    contract.read_summary(tmp_path)


# ------------------------------------------------------------------------------------------------
# typed readers


def test_load_tests_is_typed(tmp_path):
  x = np.array([[4.0, np.nan, 1.0], [4.0, np.nan, 2.0], [4.0, 7.0, 3.0]]).reshape(3, 1, 1, 3)
  df, settings = hypothesis.hypothesis_tests(x, ("sep", "local", "zeta"),
                                             settings={"rule": "paper", "alpha": 0.05})
  contract.write_tests(df, settings, tmp_path)
  t = contract.load_tests(tmp_path)
  pd.testing.assert_frame_equal(t.table, contract.read_tests(tmp_path)[0])
  assert t.settings["alpha"] == 0.05 and t.alpha == 0.05 and t.rule == "paper"
  assert t.tau == 3.0
  assert t.roles == ("local", "sep", "zeta")           # registry order, then unknown roles
  assert (t.num_layers, t.num_heads) == (1, 1) and not t.has_rules
  assert list(t.role("sep")["role"]) == ["sep"] and t.role("obj").empty
  assert t.with_rule("paper") is t.table
  with pytest.raises(ValueError, match=r"no decisions of the 'calibrated' rule \(it has \['paper'\]\)"):
    t.with_rule("calibrated")
  # with the rule columns, each rule's decisions replace `assigned`
  extra = {c: 0.0 for c in contract.RULE_COLUMNS}
  extra.update(near_uniform=False, assigned_paper=[True, False, True],
               assigned_calibrated=[False, False, True])
  ruled = contract.Tests(df.assign(**extra), {"rule": "calibrated"})
  assert ruled.has_rules
  assert list(ruled.with_rule("paper")["assigned"]) == [True, False, True]
  assert list(ruled.with_rule("calibrated")["assigned"]) == [False, False, True]
  with pytest.raises(ValueError, match=r"it has \['paper', 'calibrated'\]"):
    ruled.with_rule("best")
  with pytest.raises(ValueError, match="exactly the columns"):
    contract.Tests(df.drop(columns=["n"]))
  with pytest.raises(FileNotFoundError, match="tests.csv"):
    contract.load_tests(tmp_path / "nothing")


def test_load_clusters_and_summary_are_typed(tmp_path):
  cols = list(contract.CLUSTER_COLUMNS)
  rows = [[l, h] + [float(h + 1)] * 21 + [h % 2, ["vertical", "dense"][h % 2], 0.0, 0.0]
          for l in range(2) for h in range(2)]
  contract.write_clusters(pd.DataFrame(rows, columns=cols), {"k": 2}, tmp_path)
  c = contract.load_clusters(tmp_path)
  assert c.info == {"k": 2} and c.names == ("vertical", "dense")
  assert c.features.shape == (4, 21) and c.features[1, 0] == 2.0
  assert c.name_of() == {(0, 0): "vertical", (0, 1): "dense", (1, 0): "vertical", (1, 1): "dense"}
  assert contract.has_clusters(tmp_path) and not contract.has_clusters(tmp_path / "x")

  assert contract.load_summary(tmp_path, missing_ok=True) is None
  with pytest.raises(FileNotFoundError, match="summary.json"):
    contract.load_summary(tmp_path)
  contract.write_summary({"share_local": 0.25, "share_block": None, "num_layers": 2,
                          "rule": "calibrated", "spearman_local_syntactic": np.nan,
                          "num_heads_by_coarse_role": {"local": 1, "unskilled": 3},
                          "by_rule": {"paper": {"share_local": 0.5,
                                                "num_heads_by_coarse_role": {"local": 2}},
                                      "calibrated": {"share_local": 0.25}}}, tmp_path)
  s = contract.load_summary(tmp_path)
  assert s.num_layers == 2 and s.rule == "calibrated" and s.spearman_local_syntactic is None
  assert s["share_local"] == 0.25 and "share_block" in s and s.get("nope", 7) == 7
  assert s.rules == ("paper", "calibrated")
  assert s.share("local") == 0.25 and s.share("local", "paper") == 0.5
  assert s.share("block") is None
  assert s.num_heads_by_coarse_role() == {"local": 1, "unskilled": 3}
  assert s.num_heads_by_coarse_role("paper") == {"local": 2}
  with pytest.raises(KeyError, match="no figures for rule 'best'"):
    s.for_rule("best")
  plain = contract.Summary({"share_local": 0.1, "rule": "paper"})   # a run without rule columns
  assert plain.share("local", "paper") == 0.1 and plain.rules == ()


def test_disk_full_during_a_write_leaves_the_previous_file_and_no_partial_one(tmp_path, monkeypatch):
  # issue 28: disk full left a partial file beside the previous one.
  import errno
  sb = np.zeros((2, 1, 2, 1), np.float32)
  contract.write_scores(tmp_path, sb, ("local",))
  before = (tmp_path / contract.SCORES_FILE).read_bytes()

  def full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "scores.npz.tmp"))
  monkeypatch.setattr(contract.np, "savez", full)
  with pytest.raises(OSError):
    contract.write_scores(tmp_path, sb + 1, ("local",))
  assert sorted(p.name for p in tmp_path.iterdir()) == [contract.SCORES_FILE]
  assert (tmp_path / contract.SCORES_FILE).read_bytes() == before
  monkeypatch.undo()
  # a truncated scores.npz is one ValueError naming the file and the fix
  (tmp_path / contract.SCORES_FILE).write_bytes(before[: len(before) // 3])
  with pytest.raises(ValueError, match="scores.npz is damaged or not an npz file .*--overwrite"):
    contract.read_scores(tmp_path)
