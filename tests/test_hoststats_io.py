"""Contract files: scores.npz, tests.csv/json, settings.json, clusters.csv/json round trips."""
import json

import numpy as np
import pandas as pd
import pytest

from heads_jax.data import batch as batch_lib
from heads_jax.hoststats import hypothesis, io


def _scores(b=4, l=2, h=3, roles=("local", "cls", "syntactic"), seed=0):
  rng = np.random.default_rng(seed)
  sb = rng.normal(3, 1, (b, l, h, len(roles))).astype(np.float32)
  sb[0, :, :, 2] = np.nan
  distance = rng.dirichlet(np.ones(21), (b, l, h)).astype(np.float32)
  return sb, roles, distance, np.arange(5, 5 + b)


def test_scores_round_trip(tmp_path):
  sb, roles, distance, lengths = _scores()
  path = io.write_scores(tmp_path, sb, roles, distance, lengths)
  assert path == tmp_path / "scores.npz"
  for where in (tmp_path, path):
    s = io.read_scores(where)
    np.testing.assert_array_equal(s.sieve_bias, sb)
    np.testing.assert_array_equal(s.distance, distance)
    np.testing.assert_array_equal(s.lengths, lengths)
    assert s.roles == roles
    assert (s.num_sequences, s.num_layers, s.num_heads) == (4, 2, 3)


def test_read_scores_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="scores.npz"):
    io.read_scores(tmp_path)
  np.savez(tmp_path / "scores.npz", sieve_bias=np.zeros((1, 1, 1, 2), np.float32))
  with pytest.raises(ValueError, match="roles"):
    io.read_scores(tmp_path)
  np.savez(tmp_path / "scores.npz", sieve_bias=np.zeros((1, 1, 1, 2), np.float32),
           roles=np.array(["local"]))
  with pytest.raises(ValueError, match="must match the last axis"):
    io.read_scores(tmp_path)
  sb, roles, distance, _ = _scores()
  with pytest.raises(ValueError, match="distance"):
    io.write_scores(tmp_path, sb, roles, distance[:, :1])
  with pytest.raises(ValueError, match="infinite"):
    io.write_scores(tmp_path, np.full((1, 1, 1, 1), np.inf, np.float32), ("local",))


def test_tests_round_trip(tmp_path):
  x = np.array([[4.0, np.nan, 1.0], [4.0, np.nan, 2.0], [4.0, 7.0, 3.0]]).reshape(3, 1, 1, 3)
  df, settings = hypothesis.hypothesis_tests(x, ("local", "cls", "sep"),
                                             settings={"model": "bert", "max_length": 128})
  paths = io.write_tests(df, settings, tmp_path)
  assert set(paths) == {"tests.csv", "tests.json", "settings.json"}
  first = (tmp_path / "tests.csv").read_text().splitlines()[0]
  assert first == "layer,head,role,mean,n,statistic,p_value,p_adjusted,assigned"
  back, back_settings = io.read_tests(tmp_path)
  pd.testing.assert_frame_equal(back, df, check_dtype=False)
  assert back["assigned"].dtype == bool
  assert back.loc[0, "statistic"] == np.inf  # zero variance above tau survives the CSV
  assert back_settings == json.loads(json.dumps(io.to_jsonable(settings)))
  assert back_settings["max_length"] == 128 and back_settings["tau"] == 3.0
  doc = json.loads((tmp_path / "tests.json").read_text())  # strict JSON: NaN/inf are null
  assert doc["settings"]["model"] == "bert"
  assert doc["tests"][0]["statistic"] is None and doc["tests"][1]["p_value"] is None
  assert doc["tests"][2]["role"] == "sep" and doc["tests"][2]["n"] == 3
  with pytest.raises(ValueError, match="exactly the columns"):
    io.write_tests(df.drop(columns=["n"]), settings, tmp_path)


def test_read_tests_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match="tests.csv"):
    io.read_tests(tmp_path)


def test_clusters_round_trip(tmp_path):
  cols = list(io.CLUSTER_COLUMNS)
  assert cols[2:23] == list(batch_lib.DISTANCE_FEATURES)
  rows = [[0, h] + [1 / 21] * 21 + [h % 2, ["dense", "diagonal"][h % 2], 0.5 * h, -h]
          for h in range(3)]
  df = pd.DataFrame(rows, columns=cols)
  io.write_clusters(df, {"k": 2, "stability": np.float64(1.0), "names": ("dense", "diagonal")},
                    tmp_path)
  back, info = io.read_clusters(tmp_path)
  pd.testing.assert_frame_equal(back, df, check_dtype=False)
  assert info == {"k": 2, "stability": 1.0, "names": ["dense", "diagonal"]}


def test_to_jsonable():
  out = io.to_jsonable({"a": np.float32(1.5), "b": (np.int64(2), np.nan), "c": np.array([True])})
  assert out == {"a": 1.5, "b": [2, None], "c": [True]}
  with pytest.raises(TypeError, match="JSON"):
    io.to_jsonable({"x": object()})
