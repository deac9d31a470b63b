"""Reading and writing the analysis contract files (DESIGN.md section 4) on the host.

Files of an analysis output directory handled here (names are the contract; keep them stable):

=====================  ======================================================================
file                   content
=====================  ======================================================================
``scores.npz``         ``sieve_bias`` float32 ``[b, l, h, r]`` (NaN where a role's sieve is
                       empty), ``roles`` (r names), ``distance`` float32 ``[b, l, h, d=21]``,
                       ``lengths`` int ``[b]``.
``tests.csv``          one row per (layer, head, role), the columns of
                       `heads_jax.hoststats.hypothesis.TEST_COLUMNS`; a plain CSV (no comment
                       lines) readable by pandas and spreadsheets. Empty cells are NaN;
                       zero-variance statistics are written as ``inf`` / ``-inf``.
``settings.json``      the run's settings (tau, tau_requested, alpha, test, correction, ... ).
``tests.json``         ``{"settings": ..., "tests": [row, ...]}``: the same rows as tests.csv as
                       records; non-finite numbers (NaN, +-inf) are ``null`` (strict JSON).
``clusters.csv``       one row per head, the columns of
                       `heads_jax.hoststats.clustering.CLUSTER_COLUMNS`.
``clusters.json``      the clustering info dict (method, k, names, centroids, stability, ...).
``summary.json``       the summary figures of `heads_jax.hoststats.summary.summary_figures`.
``compare_*.csv``,     the before/after comparison of `heads_jax.hoststats.compare`
``compare.json``       (written into the comparison's own output directory).
=====================  ======================================================================

Host-only module (numpy, pandas); no jax.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from heads_jax.data import batch as batch_lib

SCORES_FILE = "scores.npz"
TESTS_CSV = "tests.csv"
TESTS_JSON = "tests.json"
SETTINGS_JSON = "settings.json"
CLUSTERS_CSV = "clusters.csv"
CLUSTERS_JSON = "clusters.json"
SUMMARY_JSON = "summary.json"
COMPARE_SIEVE_BIAS_CSV = "compare_sieve_bias.csv"
COMPARE_ROLES_CSV = "compare_roles.csv"
COMPARE_CLUSTERS_CSV = "compare_clusters.csv"
COMPARE_JSON = "compare.json"

# Kept here (not imported from hypothesis / clustering) so that io has no dependency on them.
TEST_COLUMNS = ("layer", "head", "role", "mean", "n", "statistic", "p_value", "p_adjusted",
                "assigned")
CLUSTER_COLUMNS = (("layer", "head") + tuple(batch_lib.DISTANCE_FEATURES)
                   + ("cluster", "cluster_name", "tsne_x", "tsne_y"))


@dataclasses.dataclass(frozen=True)
class Scores:
  """The content of ``scores.npz``.

  Attributes:
    sieve_bias: float32 ``[b, l, h, r]``, NaN where a role's sieve is empty for a sequence.
    roles: the r role names (order of `heads_jax.data.batch.ROLES`, minus roles not computed).
    distance: float32 ``[b, l, h, d]`` (d = 21, order `batch.DISTANCE_FEATURES`), or None when
      the run computed no distance features.
    lengths: int ``[b]`` real positions per sequence, or None when absent.
  """
  sieve_bias: np.ndarray
  roles: tuple[str, ...]
  distance: np.ndarray | None = None
  lengths: np.ndarray | None = None

  def __post_init__(self):
    validate_scores(self.sieve_bias, self.roles, self.distance, self.lengths)

  @property
  def num_sequences(self) -> int:
    return int(self.sieve_bias.shape[0])

  @property
  def num_layers(self) -> int:
    return int(self.sieve_bias.shape[1])

  @property
  def num_heads(self) -> int:
    return int(self.sieve_bias.shape[2])


def validate_scores(sieve_bias, roles, distance=None, lengths=None) -> None:
  """Raises ValueError with a clear message when the arrays do not follow the contract."""
  sieve_bias = np.asarray(sieve_bias)
  if sieve_bias.ndim != 4:
    raise ValueError(f"sieve_bias must have shape [b, l, h, r] (4 axes); got shape "
                     f"{sieve_bias.shape}")
  if not np.issubdtype(sieve_bias.dtype, np.floating):
    raise ValueError(f"sieve_bias must be a float array (NaN marks empty sieves); got "
                     f"{sieve_bias.dtype}")
  roles = tuple(roles)
  if len(roles) != sieve_bias.shape[3]:
    raise ValueError(f"{len(roles)} role names {list(roles)} for a sieve_bias role axis of size "
                     f"{sieve_bias.shape[3]}; the names must match the last axis")
  if not all(isinstance(r, str) and r for r in roles):
    raise ValueError(f"role names must be non-empty strings; got {list(roles)}")
  if len(set(roles)) != len(roles):
    raise ValueError(f"role names must be unique; got {list(roles)}")
  if np.isinf(sieve_bias).any():
    raise ValueError("sieve_bias holds infinite values; a sieve bias is a finite ratio (NaN for an "
                     "empty sieve): check the statistics stage that wrote it")
  b, l, h, _ = sieve_bias.shape
  if distance is not None:
    distance = np.asarray(distance)
    if distance.shape != (b, l, h, len(batch_lib.DISTANCE_FEATURES)):
      raise ValueError(f"distance must have shape [b, l, h, {len(batch_lib.DISTANCE_FEATURES)}] = "
                       f"{(b, l, h, len(batch_lib.DISTANCE_FEATURES))} to match sieve_bias; got "
                       f"{distance.shape}")
  if lengths is not None:
    lengths = np.asarray(lengths)
    if lengths.shape != (b,):
      raise ValueError(f"lengths must have shape [b] = ({b},); got {lengths.shape}")


def _scores_file(path) -> Path:
  """A path ending in .npz is the scores file itself; any other path is an output directory."""
  path = Path(path)
  return path if path.suffix == ".npz" else path / SCORES_FILE


def write_scores(path, sieve_bias, roles, distance=None, lengths=None) -> Path:
  """Writes ``scores.npz``; path: a ``*.npz`` file, or an output directory (created if needed)."""
  validate_scores(sieve_bias, roles, distance, lengths)
  path = _scores_file(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  arrays = {"sieve_bias": np.asarray(sieve_bias, np.float32), "roles": np.asarray(list(roles), str)}
  if distance is not None:
    arrays["distance"] = np.asarray(distance, np.float32)
  if lengths is not None:
    arrays["lengths"] = np.asarray(lengths, np.int32)
  with open(path, "wb") as f:
    np.savez(f, **arrays)
  return path


def read_scores(path) -> Scores:
  """Reads ``scores.npz`` (path: the file or the analysis output directory holding it)."""
  file = _scores_file(path)
  if not file.exists():
    raise FileNotFoundError(f"no {SCORES_FILE} at {file}: pass the analysis output directory "
                            f"(or the npz file itself) written by the `analyze` entry point")
  with np.load(file, allow_pickle=False) as data:
    missing = [k for k in ("sieve_bias", "roles") if k not in data.files]
    if missing:
      raise ValueError(f"{file} lacks {missing}; it holds {data.files}. A scores file needs at "
                       f"least sieve_bias [b, l, h, r] and roles [r]")
    distance = data["distance"] if "distance" in data.files else None
    lengths = data["lengths"] if "lengths" in data.files else None
    return Scores(sieve_bias=data["sieve_bias"], roles=tuple(str(r) for r in data["roles"]),
                  distance=distance, lengths=lengths)


def to_jsonable(obj: Any) -> Any:
  """Converts numpy scalars/arrays, tuples and paths to JSON types; NaN and +-inf become None."""
  if isinstance(obj, Mapping):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return to_jsonable(obj.tolist())
  if isinstance(obj, (np.bool_, bool)):
    return bool(obj)
  if isinstance(obj, (np.integer, int)):
    return int(obj)
  if isinstance(obj, (np.floating, float)):
    obj = float(obj)
    return obj if math.isfinite(obj) else None
  if isinstance(obj, os.PathLike):
    return os.fspath(obj)
  if obj is None or isinstance(obj, str):
    return obj
  raise TypeError(f"cannot write {type(obj).__name__} {obj!r} as JSON; use numbers, strings, "
                  f"lists or dicts in settings and info dicts")


def write_json(obj, path) -> Path:
  """Writes strict JSON (NaN/inf as null), indented."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    json.dump(to_jsonable(obj), f, indent=2, allow_nan=False)
    f.write("\n")
  return path


def read_json(path) -> Any:
  with open(path) as f:
    return json.load(f)


def _check_columns(df: pd.DataFrame, columns, what: str) -> None:
  if tuple(df.columns) != tuple(columns):
    raise ValueError(f"{what} must have exactly the columns {list(columns)}; got "
                     f"{list(df.columns)}")


def _records(df: pd.DataFrame) -> list[dict]:
  return to_jsonable(df.to_dict(orient="records"))


def write_tests(df: pd.DataFrame, settings: Mapping, out_dir) -> dict[str, Path]:
  """Writes tests.csv, tests.json ({"settings", "tests"}) and settings.json into out_dir.

  Returns the written paths by file name.
  """
  _check_columns(df, TEST_COLUMNS, "the tests table")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {TESTS_CSV: out_dir / TESTS_CSV}
  df.to_csv(paths[TESTS_CSV], index=False)
  paths[TESTS_JSON] = write_json({"settings": settings, "tests": _records(df)},
                                 out_dir / TESTS_JSON)
  paths[SETTINGS_JSON] = write_json(settings, out_dir / SETTINGS_JSON)
  return paths


def read_tests(out_dir) -> tuple[pd.DataFrame, dict]:
  """Reads tests.csv and the settings (settings.json, else tests.json) of an output directory."""
  out_dir = Path(out_dir)
  csv = out_dir / TESTS_CSV
  if not csv.exists():
    raise FileNotFoundError(f"no {TESTS_CSV} in {out_dir}: run the hypothesis tests first "
                            f"(`analyze`, or hypothesis.hypothesis_tests + io.write_tests)")
  df = pd.read_csv(csv, dtype={"role": str})
  _check_columns(df, TEST_COLUMNS, str(csv))
  df["assigned"] = df["assigned"].astype(bool)
  if (out_dir / SETTINGS_JSON).exists():
    settings = read_json(out_dir / SETTINGS_JSON)
  elif (out_dir / TESTS_JSON).exists():
    settings = read_json(out_dir / TESTS_JSON)["settings"]
  else:
    settings = {}
  return df, settings


def write_clusters(df: pd.DataFrame, info: Mapping, out_dir) -> dict[str, Path]:
  """Writes clusters.csv (one row per head) and clusters.json (the info dict) into out_dir."""
  _check_columns(df, CLUSTER_COLUMNS, "the clusters table")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {CLUSTERS_CSV: out_dir / CLUSTERS_CSV}
  df.to_csv(paths[CLUSTERS_CSV], index=False)
  paths[CLUSTERS_JSON] = write_json(info, out_dir / CLUSTERS_JSON)
  return paths


def read_clusters(out_dir) -> tuple[pd.DataFrame, dict]:
  """Reads clusters.csv and clusters.json (info; {} when absent) of an output directory."""
  out_dir = Path(out_dir)
  csv = out_dir / CLUSTERS_CSV
  if not csv.exists():
    raise FileNotFoundError(f"no {CLUSTERS_CSV} in {out_dir}: run the head clustering first "
                            f"(`analyze` with distance features, or clustering.cluster_heads + "
                            f"io.write_clusters)")
  df = pd.read_csv(csv, dtype={"cluster_name": str})
  _check_columns(df, CLUSTER_COLUMNS, str(csv))
  info = read_json(out_dir / CLUSTERS_JSON) if (out_dir / CLUSTERS_JSON).exists() else {}
  return df, info


def write_summary(summary: Mapping, out_dir) -> Path:
  """Writes summary.json into out_dir."""
  return write_json(summary, Path(out_dir) / SUMMARY_JSON)


def read_summary(out_dir) -> dict:
  path = Path(out_dir) / SUMMARY_JSON
  if not path.exists():
    raise FileNotFoundError(f"no {SUMMARY_JSON} in {out_dir}: compute it with "
                            f"summary.summary_figures + io.write_summary")
  return read_json(path)


def write_comparison(comparison, out_dir) -> dict[str, Path]:
  """Writes a `heads_jax.hoststats.compare.Comparison` into out_dir.

  Files: compare_sieve_bias.csv, compare_roles.csv, compare_clusters.csv (only when the
  comparison has cluster changes) and compare.json (directories, settings, warnings).
  """
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {COMPARE_SIEVE_BIAS_CSV: out_dir / COMPARE_SIEVE_BIAS_CSV,
           COMPARE_ROLES_CSV: out_dir / COMPARE_ROLES_CSV}
  comparison.sieve_bias.to_csv(paths[COMPARE_SIEVE_BIAS_CSV], index=False)
  comparison.roles.to_csv(paths[COMPARE_ROLES_CSV], index=False)
  if comparison.clusters is not None:
    paths[COMPARE_CLUSTERS_CSV] = out_dir / COMPARE_CLUSTERS_CSV
    comparison.clusters.to_csv(paths[COMPARE_CLUSTERS_CSV], index=False)
  meta = {"before_dir": str(comparison.before_dir), "after_dir": str(comparison.after_dir),
          "settings_before": comparison.settings_before,
          "settings_after": comparison.settings_after, "warnings": list(comparison.warnings)}
  paths[COMPARE_JSON] = write_json(meta, out_dir / COMPARE_JSON)
  return paths


def read_comparison(out_dir):
  """Reads what `write_comparison` wrote back into a `compare.Comparison`."""
  from heads_jax.hoststats import compare  # local: compare imports this module
  out_dir = Path(out_dir)
  if not (out_dir / COMPARE_JSON).exists():
    raise FileNotFoundError(f"no {COMPARE_JSON} in {out_dir}: run compare.compare_runs + "
                            f"io.write_comparison first")
  meta = read_json(out_dir / COMPARE_JSON)
  text = {c: str for c in ("roles_before", "roles_after", "gained", "lost")}
  roles = pd.read_csv(out_dir / COMPARE_ROLES_CSV, dtype=text, keep_default_na=False)
  clusters = None
  if (out_dir / COMPARE_CLUSTERS_CSV).exists():
    clusters = pd.read_csv(out_dir / COMPARE_CLUSTERS_CSV,
                           dtype={"cluster_before": str, "cluster_after": str})
    clusters["changed"] = clusters["changed"].astype(bool)
  return compare.Comparison(
      sieve_bias=pd.read_csv(out_dir / COMPARE_SIEVE_BIAS_CSV), roles=roles, clusters=clusters,
      warnings=list(meta.get("warnings", [])), before_dir=meta.get("before_dir"),
      after_dir=meta.get("after_dir"), settings_before=meta.get("settings_before", {}),
      settings_after=meta.get("settings_after", {}))
