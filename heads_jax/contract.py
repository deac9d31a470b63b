"""The on-disk contract of an analysis (DESIGN.md section 4): the one writer and one reader of
every file an analysis, a comparison and the report exchange.

Every stage goes through this module: the analysis job (`heads_jax.pipelines.analyze`) writes
scores.npz, measures.npz and run.json; the host statistics' results are written by
``write_tests`` / ``write_summary`` / ``write_clusters``; the comparison by
``write_comparison``; the report (`heads_jax.report`) reads them all back with the ``read_*``
functions. Nothing else opens these files. Names, keys and shapes are the contract: keep them
stable (new keys are additive).

=====================  ======================================================================
file                   content (writer / reader)
=====================  ======================================================================
``scores.npz``         ``sieve_bias`` float32 ``[b, l, h, r]`` (NaN where a role's sieve is
                       empty), ``roles`` (r names), ``distance`` float32 ``[b, l, h, d=21]``,
                       ``lengths`` int32 ``[b]``; optionally ``data_index`` int32 ``[b]`` (which
                       data spec a sequence came from, when there are several) and
                       ``norm_sieve_bias`` float32 ``[b, l, h, r]`` (the sieve bias of the norm
                       weights ``||a[q, k] f(x_k)||``, `heads_jax.stats.norms`);
                       ``special_share`` float32 ``[b]`` (the share of each sequence's real keys
                       that are [CLS], [SEP], comma or period: the clustering's reference);
                       for a model with windowed layers (ModernBERT) ``windows`` int32 ``[l]``
                       (each layer's half window, -1 for full attention) and ``uniform`` float32
                       ``[b, l, r]`` (the sieve bias of attention uniform over the keys each
                       layer's heads see, per sequence: the calibrated rule's baseline).
                       `write_scores` / `read_scores` (a `Scores`).
``measures.npz``       ``entropy``, ``cls_entropy`` float32 ``[b, l, h]``, ``token_attention``
                       float32 ``[b, l, h, 5]`` (columns ``token_measures`` =
                       `TOKEN_MEASURES`), ``lengths`` int32 ``[b]``; optionally ``js`` float32
                       ``[l*h, l*h]`` (mean Jensen-Shannon distance between heads) with
                       ``js_sequences``, and ``data_index``; for DeBERTa models ``term_shares``
                       float32 ``[b, l, h, 3]`` (each head's share of its logits' variance
                       over the keys from the terms ``term_names`` = `TERM_NAMES`,
                       `heads_jax.model.deberta`). `write_measures` / `read_measures`.
``run.json``           ``{"device": the settings that determine scores.npz, "data_info": [...],
                       "inputs": {"model", "data"}}`` of the analysis job (``inputs``: the
                       content identity of the model and data files). `write_run` / `read_run`.
``tests.csv``          one row per (layer, head, role), the columns `TEST_COLUMNS`, then (an
                       analysis run always writes them) `RULE_COLUMNS`: the calibrated rule's
                       tests and both rules' decisions (`heads_jax.hoststats.calibration`;
                       ``assigned`` is the decision of the run's ``rule``); a plain CSV
                       (no comment lines) readable by pandas and spreadsheets. Empty cells are
                       NaN; zero-variance statistics are written as ``inf`` / ``-inf``. With the
                       norm weighting (issue 26) a last column ``weighting`` ("attention" or
                       "norm") and a second block of rows, the tests of ``norm_sieve_bias``;
                       `read_tests` returns one weighting's rows (default attention).
``settings.json``      the run's settings (tau, tau_requested, alpha, test, correction, ... ).
``tests.json``         ``{"settings": ..., "tests": [row, ...]}``: the same rows as tests.csv as
                       records; non-finite numbers (NaN, +-inf) are ``null`` (strict JSON).
                       These three: `write_tests` / `load_tests` (a `Tests`; `read_tests`
                       gives the raw (table, settings)).
``clusters.csv``       one row per head, the columns `CLUSTER_COLUMNS`.
``clusters.json``      the clustering info dict (method, k, names, centroids, stability, ...).
                       Both: `write_clusters` / `load_clusters` (a `Clusters`).
``parser.csv``         heads as dependency parsers (issue 26): one row per (relation, direction,
                       head or fixed offset), the columns `PARSER_COLUMNS`. `write_parser` /
                       `read_parser`.
``robustness.npz``     the analysis's second pass (`heads_jax.stats.norms`): ``first_attention``,
                       ``norm_ratio`` float32 ``[b, l, h]``, ``sep_attention`` ``[b, l, h, 2]``,
                       ``parse_pred`` int16 ``[b, l, h, w]`` and the gold arcs (``arc_sequence``,
                       ``arc_dependent``, ``arc_head``, ``arc_relation``). `write_robustness` /
                       `read_robustness`. Its ``norm_sieve_bias`` ``[b, l, h, r]`` is in
                       scores.npz; its tests are the tests.csv rows with ``weighting`` = norm.
``summary.json``       the summary figures of `heads_jax.hoststats.summary.summary_figures`.
                       `write_summary` / `load_summary` (a `Summary`).
``compare_*.csv``,     the before/after comparison of `heads_jax.hoststats.compare` (a
``compare.json``       `Comparison`, written into the comparison's own output directory).
                       `write_comparison` / `read_comparison`.
``trajectory.csv``     roles over training (``heads-jax trajectory``, its own output directory):
                       one row per checkpoint, the columns ``step``, ``share_<coarse role>``,
                       ``bias_<role>``, ``sink_rate``; its figure ``trajectory.png`` / ``.svg``.
                       `write_trajectory` / `read_trajectory`.
=====================  ======================================================================

npz files are written to a temporary name and renamed, so a reader never sees half a file.

Host-only module (numpy, pandas; the constants of `heads_jax.data.vocabulary`); no jax. It sits
just above ``data`` in the stage order, so that every later stage can use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from heads_jax.data import vocabulary
from heads_jax.storage import naming

SCORES_FILE = "scores.npz"
# The arrays the second pass adds to scores.npz after the first pass wrote it (its other arrays
# it writes back bit for bit): what tells the first pass's file from a replaced one leaves them out.
SECOND_PASS_ARRAYS = ("norm_sieve_bias",)
MEASURES_FILE = "measures.npz"
RUN_FILE = "run.json"
TESTS_CSV = "tests.csv"
TESTS_JSON = "tests.json"
SETTINGS_JSON = "settings.json"
CLUSTERS_CSV = "clusters.csv"
CLUSTERS_JSON = "clusters.json"
SUMMARY_JSON = "summary.json"
PARSER_CSV = "parser.csv"
ROBUSTNESS_FILE = "robustness.npz"
WEIGHTING_COLUMN = "weighting"
WEIGHTINGS = ("attention", "norm")
PARSER_COLUMNS = ("relation", "direction", "kind", "layer", "head", "offset", "accuracy", "n",
                  "low", "high")
ROBUSTNESS_KEYS = ("first_attention", "sep_attention", "norm_ratio")
EXAMPLES_JSON = "examples.json"
REPORT_HTML = "report.html"   # the report of a directory (written by heads_jax.report)
COMPARE_SIEVE_BIAS_CSV = "compare_sieve_bias.csv"
COMPARE_ROLES_CSV = "compare_roles.csv"
COMPARE_CLUSTERS_CSV = "compare_clusters.csv"
COMPARE_JSON = "compare.json"
TRAJECTORY_CSV = "trajectory.csv"   # roles over training (heads_jax.pipelines.trajectory)
TRAJECTORY_PNG = "trajectory.png"   # its figure (and .svg beside it)

TEST_COLUMNS = ("layer", "head", "role", "mean", "n", "statistic", "p_value", "p_adjusted",
                "assigned")
# Optional columns after TEST_COLUMNS (all or none): the role rules (hoststats.calibration).
RULE_COLUMNS = ("uniform", "mean_minus_uniform", "statistic_uniform", "p_uniform",
                "p_block_plain", "p_calibrated", "p_calibrated_adjusted", "near_uniform",
                "assigned_paper", "assigned_calibrated")
RULE_BOOL_COLUMNS = ("near_uniform", "assigned_paper", "assigned_calibrated")
CLUSTER_COLUMNS = (("layer", "head") + tuple(vocabulary.DISTANCE_FEATURES)
                   + ("cluster", "cluster_name", "tsne_x", "tsne_y"))
# measures.npz: the per-sequence arrays, and the token_attention columns (in this order).
MEASURE_ROW_KEYS = ("entropy", "cls_entropy", "token_attention")
TOKEN_MEASURES = ("cls", "sep", "punct", "prev", "next")
# measures.npz of a DeBERTa model: the attention-logit terms of term_shares (in this order).
TERM_NAMES = ("c2c", "c2p", "p2c")


# ---------------------------------------------------------------------------------------------
# JSON


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
  with naming(path):  # a full disk: the line names the file
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(to_jsonable(obj), f, indent=2, allow_nan=False)
      f.write("\n")
  return path


def _write_csv(df: pd.DataFrame, path) -> Path:
  """``df`` as CSV at ``path`` (an ``OSError`` names the file)."""
  with naming(path):
    df.to_csv(path, index=False)
  return Path(path)


def read_json(path, fix: str | None = None) -> Any:
  """Reads a JSON file; a file that is not JSON (or not UTF-8) is a ValueError naming it and
  what to do (``fix``, default: re-run the command that wrote it with --overwrite)."""
  path = Path(path)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    fix = fix or (f"re-run the command that wrote {path.parent} with --overwrite, or remove "
                  f"{path.parent}")
    raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from e


def _write_npz(path: Path, arrays: dict) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  try:
    with naming(path), open(tmp, "wb") as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except BaseException:  # disk full, interrupted: no half file left beside the previous one
    tmp.unlink(missing_ok=True)
    raise
  return path


def _in_dir(path, name: str) -> Path:
  """A path ending in .npz is the file itself; any other path is an output directory."""
  path = Path(path)
  return path if path.suffix == ".npz" else path / name


# ---------------------------------------------------------------------------------------------
# scores.npz


@dataclasses.dataclass(frozen=True)
class Scores:
  """The content of ``scores.npz``.

  Attributes:
    sieve_bias: float32 ``[b, l, h, r]``, NaN where a role's sieve is empty for a sequence.
    roles: the r role names (order of `heads_jax.data.vocabulary.ROLES`, minus roles not computed).
    distance: float32 ``[b, l, h, d]`` (d = 21, order `batch.DISTANCE_FEATURES`), or None when
      the file holds no distance features.
    lengths: int ``[b]`` real positions per sequence, or None when absent.
    data_index: int ``[b]``: which data spec each sequence came from, or None when absent.
    special_share: float ``[b]``: each sequence's share of special keys ([CLS], [SEP], comma,
      period), or None (a file written before it was recorded).
    windows: int ``[l]``: each layer's half window, -1 for full attention; None for a model
      without windowed layers (or an old file).
    uniform: float ``[b, l, r]``: uniform attention's sieve bias over the keys each layer sees
      (windowed models only), or None.
  """
  sieve_bias: np.ndarray
  roles: tuple[str, ...]
  distance: np.ndarray | None = None
  lengths: np.ndarray | None = None
  data_index: np.ndarray | None = None
  norm_sieve_bias: np.ndarray | None = None   # [b, l, h, r], the norm weights' (issue 26)
  special_share: np.ndarray | None = None
  windows: np.ndarray | None = None
  uniform: np.ndarray | None = None

  def __post_init__(self):
    validate_scores(self.sieve_bias, self.roles, self.distance, self.lengths, self.data_index,
                    self.special_share, self.windows, self.uniform)
    if self.norm_sieve_bias is not None and np.shape(self.norm_sieve_bias) != self.sieve_bias.shape:
      raise ValueError(f"norm_sieve_bias must have the shape of sieve_bias "
                       f"{self.sieve_bias.shape}; got {np.shape(self.norm_sieve_bias)}")

  @property
  def layer_windows(self) -> tuple | None:
    """Per layer, the half window of a windowed layer or None (full attention); None when the
    file records no windowed layer."""
    if self.windows is None or not (np.asarray(self.windows) >= 0).any():
      return None
    return tuple(None if w < 0 else int(w) for w in np.asarray(self.windows).tolist())

  @property
  def num_sequences(self) -> int:
    return int(self.sieve_bias.shape[0])

  @property
  def num_layers(self) -> int:
    return int(self.sieve_bias.shape[1])

  @property
  def num_heads(self) -> int:
    return int(self.sieve_bias.shape[2])


def validate_scores(sieve_bias, roles, distance=None, lengths=None, data_index=None,
                    special_share=None, windows=None, uniform=None) -> None:
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
  d = len(vocabulary.DISTANCE_FEATURES)
  if distance is not None and np.shape(distance) != (b, l, h, d):
    raise ValueError(f"distance must have shape [b, l, h, {d}] = {(b, l, h, d)} to match "
                     f"sieve_bias; got {np.shape(distance)}")
  for name, x in (("lengths", lengths), ("data_index", data_index)):
    if x is None:
      continue
    x = np.asarray(x)
    if x.shape != (b,):
      raise ValueError(f"{name} must have shape [b] = ({b},); got {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
      raise ValueError(f"{name} must be integer; got {x.dtype}")
  if special_share is not None:
    x = np.asarray(special_share, np.float64)
    if x.shape != (b,) or np.isnan(x).any() or (x < 0).any() or (x > 1).any():
      raise ValueError(f"special_share must be [b] = ({b},) shares in [0, 1]; got shape "
                       f"{x.shape}")
  if (windows is None) != (uniform is None):
    raise ValueError("windows and uniform come together (a windowed model's baselines); got "
                     f"only {'windows' if uniform is None else 'uniform'}")
  if windows is not None:
    if np.shape(windows) != (l,) or not np.issubdtype(np.asarray(windows).dtype, np.integer):
      raise ValueError(f"windows must be int [l] = ({l},); got {np.shape(windows)}")
    if np.shape(uniform) != (b, l, sieve_bias.shape[3]):
      raise ValueError(f"uniform must have shape [b, l, r] = {(b, l, sieve_bias.shape[3])}; got "
                       f"{np.shape(uniform)}")


def write_scores(path, sieve_bias, roles, distance=None, lengths=None, data_index=None,
                 norm_sieve_bias=None, special_share=None, windows=None, uniform=None) -> Path:
  """Writes ``scores.npz``; path: a ``*.npz`` file, or an output directory (created if needed).

  Args:
    sieve_bias: float ``[b, l, h, r]`` (stored as float32).
    roles: the r role names.
    distance: float ``[b, l, h, 21]`` or None (stored as float32).
    lengths: int ``[b]`` or None (stored as int32).
    data_index: int ``[b]`` or None (stored as int32).
    norm_sieve_bias: float ``[b, l, h, r]`` or None (stored as float32).
    special_share: float ``[b]`` or None (stored as float32).
    windows, uniform: int ``[l]`` (-1: full attention) and float ``[b, l, r]``, both or neither.
  """
  roles = tuple(str(r) for r in roles)
  validate_scores(sieve_bias, roles, distance, lengths, data_index, special_share, windows,
                  uniform)
  if norm_sieve_bias is not None and np.shape(norm_sieve_bias) != np.shape(sieve_bias):
    raise ValueError(f"norm_sieve_bias must have the shape of sieve_bias {np.shape(sieve_bias)}; "
                     f"got {np.shape(norm_sieve_bias)}")
  arrays = {"sieve_bias": np.asarray(sieve_bias, np.float32), "roles": np.asarray(roles, str)}
  if distance is not None:
    arrays["distance"] = np.asarray(distance, np.float32)
  if lengths is not None:
    arrays["lengths"] = np.asarray(lengths, np.int32)
  if data_index is not None:
    arrays["data_index"] = np.asarray(data_index, np.int32)
  if norm_sieve_bias is not None:
    arrays["norm_sieve_bias"] = np.asarray(norm_sieve_bias, np.float32)
  if special_share is not None:
    arrays["special_share"] = np.asarray(special_share, np.float32)
  if windows is not None:
    arrays["windows"] = np.asarray(windows, np.int32)
    arrays["uniform"] = np.asarray(uniform, np.float32)
  return _write_npz(_in_dir(path, SCORES_FILE), arrays)


def read_scores(path) -> Scores:
  """Reads ``scores.npz`` (path: the file or the analysis output directory holding it)."""
  file = _in_dir(path, SCORES_FILE)
  if not file.is_file():
    raise FileNotFoundError(f"no {SCORES_FILE} at {file}: pass the analysis output directory "
                            f"(or the npz file itself) written by the `analyze` entry point")
  try:
    with np.load(file, allow_pickle=False) as data:
      missing = [k for k in ("sieve_bias", "roles") if k not in data.files]
      if missing:
        raise ValueError(f"{file} lacks {missing}; it holds {data.files}. A scores file needs "
                         f"at least sieve_bias [b, l, h, r] and roles [r]")
      optional = {k: data[k] if k in data.files else None
                  for k in ("distance", "lengths", "data_index", "norm_sieve_bias",
                            "special_share", "windows", "uniform")}
      return Scores(sieve_bias=data["sieve_bias"], roles=tuple(str(r) for r in data["roles"]),
                    **optional)
  except (zipfile.BadZipFile, EOFError, OSError, KeyError) as e:  # truncated or not an npz
    raise ValueError(f"{file} is damaged or not an npz file ({type(e).__name__}: {e}); run the "
                     "analysis again with --overwrite") from None


# ---------------------------------------------------------------------------------------------
# measures.npz


def write_measures(path, measures: Mapping) -> Path:
  """Writes ``measures.npz`` (path: the file or an output directory).

  ``measures``: ``entropy``, ``cls_entropy`` ``[b, l, h]``, ``token_attention`` ``[b, l, h, 5]``
  (columns `TOKEN_MEASURES`), ``lengths`` ``[b]``, and optionally ``js`` ``[l*h, l*h]`` with
  ``js_sequences`` and ``data_index`` ``[b]``, and ``term_shares`` ``[b, l, h, 3]`` (DeBERTa)
  (e.g. `heads_jax.stats.collector.collect`'s
  result with a measures step, or `combine_measures` of several).
  """
  missing = [k for k in MEASURE_ROW_KEYS + ("lengths",) if k not in measures]
  if missing:
    raise KeyError(f"the measures lack {missing}: make the analysis step with measures=True")
  entropy = np.asarray(measures["entropy"], np.float32)
  if entropy.ndim != 3:
    raise ValueError(f"entropy must be [b, l, h], got shape {entropy.shape}")
  b, l, h = entropy.shape
  token = np.asarray(measures["token_attention"], np.float32)
  if token.shape != (b, l, h, len(TOKEN_MEASURES)):
    raise ValueError(f"token_attention must be {(b, l, h, len(TOKEN_MEASURES))}, got {token.shape}")
  arrays = {"entropy": entropy, "cls_entropy": np.asarray(measures["cls_entropy"], np.float32),
            "token_attention": token, "token_measures": np.asarray(TOKEN_MEASURES, dtype=str),
            "lengths": np.asarray(measures["lengths"], np.int32)}
  if arrays["cls_entropy"].shape != (b, l, h) or arrays["lengths"].shape != (b,):
    raise ValueError("cls_entropy must be [b, l, h] and lengths [b] like entropy")
  if measures.get("js") is not None:
    js = np.asarray(measures["js"], np.float32)
    if js.shape != (l * h, l * h):
      raise ValueError(f"js must be [l*h, l*h] = {(l * h, l * h)}, got {js.shape}")
    arrays["js"] = js
    arrays["js_sequences"] = np.int64(measures.get("js_sequences", b))
  if "data_index" in measures:
    arrays["data_index"] = np.asarray(measures["data_index"], np.int32)
  if measures.get("term_shares") is not None:
    shares = np.asarray(measures["term_shares"], np.float32)
    if shares.shape != (b, l, h, len(TERM_NAMES)):
      raise ValueError(f"term_shares must be {(b, l, h, len(TERM_NAMES))}, got {shares.shape}")
    arrays["term_shares"] = shares
    arrays["term_names"] = np.asarray(TERM_NAMES, dtype=str)
  return _write_npz(_in_dir(path, MEASURES_FILE), arrays)


def read_measures(path) -> dict:
  """Reads ``measures.npz`` (the file, or an analysis directory holding one): a dict of its
  arrays, with ``token_measures`` as a tuple of str."""
  file = _in_dir(path, MEASURES_FILE)
  if not file.is_file():
    raise FileNotFoundError(f"no measures file at {file}; run the analysis with measures on")
  with np.load(file, allow_pickle=False) as data:
    missing = [k for k in MEASURE_ROW_KEYS + ("lengths",) if k not in data.files]
    if missing:
      raise ValueError(f"{file} is not a measures.npz: it lacks {missing} (has {data.files})")
    out = {k: data[k] for k in data.files}
  out["token_measures"] = tuple(str(x) for x in out.get("token_measures", TOKEN_MEASURES))
  if "term_names" in out:
    out["term_names"] = tuple(str(x) for x in out["term_names"])
  return out


# ---------------------------------------------------------------------------------------------
# run.json


def write_run(out_dir, device: Mapping, data_info: list, inputs: Mapping | None = None) -> Path:
  """Writes ``run.json`` (atomically): the settings that determine scores.npz, the data specs'
  info, and ``inputs``: the content identity of the model and data files (size and mtime per
  file), on which a reuse of scores.npz keys."""
  path = Path(out_dir) / RUN_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  doc = {"device": device, "data_info": data_info}
  if inputs is not None:
    doc["inputs"] = inputs
  tmp = path.with_name(path.name + ".tmp")
  with naming(path):
    tmp.write_text(json.dumps(doc, indent=2, default=str), encoding="utf-8")
  os.replace(tmp, path)
  return path


def read_run(out_dir) -> dict | None:
  """The ``run.json`` of an output directory, or None when there is none (not JSON: a
  ValueError naming the file)."""
  path = Path(out_dir) / RUN_FILE
  if not path.is_file():
    return None
  return read_json(path, fix=f"pass --overwrite to analyse again into {path.parent}, or choose "
                             "another --out")


# ---------------------------------------------------------------------------------------------
# tests, clusters, summary


def _check_columns(df: pd.DataFrame, columns, what: str) -> None:
  if tuple(df.columns) != tuple(columns):
    raise ValueError(f"{what} must have exactly the columns {list(columns)}; got "
                     f"{list(df.columns)}")


def _check_test_columns(df: pd.DataFrame, what: str) -> None:
  """`TEST_COLUMNS`, or `TEST_COLUMNS` followed by `RULE_COLUMNS`; either may end with
  ``weighting`` (the norm weighting's rows, issue 26)."""
  columns = tuple(df.columns)
  if columns and columns[-1] == WEIGHTING_COLUMN:
    columns = columns[:-1]
  if columns != TEST_COLUMNS and columns != TEST_COLUMNS + RULE_COLUMNS:
    _check_columns(df, TEST_COLUMNS + RULE_COLUMNS, what)


def write_tests(df: pd.DataFrame, settings: Mapping, out_dir) -> dict[str, Path]:
  """Writes tests.csv, tests.json ({"settings", "tests"}) and settings.json into out_dir.

  Returns the written paths by file name.
  """
  _check_test_columns(df, "the tests table")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {TESTS_CSV: out_dir / TESTS_CSV}
  _write_csv(df, paths[TESTS_CSV])
  records = to_jsonable(df.to_dict(orient="records"))
  paths[TESTS_JSON] = write_json({"settings": settings, "tests": records}, out_dir / TESTS_JSON)
  paths[SETTINGS_JSON] = write_json(settings, out_dir / SETTINGS_JSON)
  return paths


def read_tests(out_dir, weighting: str = "attention") -> tuple[pd.DataFrame, dict]:
  """Reads tests.csv and the settings (settings.json, else tests.json) of an output directory.

  ``weighting``: the rows of the attention weights (default; the table every reader knows) or of
  the norm weights (``"norm"``; empty when the run has none); the ``weighting`` column is dropped.
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
  out_dir = Path(out_dir)
  csv = out_dir / TESTS_CSV
  if not csv.is_file():
    raise FileNotFoundError(f"no {TESTS_CSV} in {out_dir}: run the hypothesis tests first "
                            f"(`analyze`, or hypothesis.hypothesis_tests + contract.write_tests)")
  df = pd.read_csv(csv, dtype={"role": str})
  _check_test_columns(df, str(csv))
  if WEIGHTING_COLUMN in df.columns:
    df = df[df[WEIGHTING_COLUMN] == weighting].drop(columns=WEIGHTING_COLUMN).reset_index(drop=True)
  elif weighting != "attention":
    df = df.iloc[:0]
  for column in ("assigned",) + RULE_BOOL_COLUMNS:
    if column in df.columns:
      df[column] = df[column].astype(bool)
  if (out_dir / SETTINGS_JSON).is_file():
    settings = read_json(out_dir / SETTINGS_JSON)
  elif (out_dir / TESTS_JSON).is_file():
    settings = read_json(out_dir / TESTS_JSON).get("settings", {})
  else:
    settings = {}
  return df, settings


def write_clusters(df: pd.DataFrame, info: Mapping, out_dir) -> dict[str, Path]:
  """Writes clusters.csv (one row per head) and clusters.json (the info dict) into out_dir."""
  _check_columns(df, CLUSTER_COLUMNS, "the clusters table")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {CLUSTERS_CSV: out_dir / CLUSTERS_CSV}
  _write_csv(df, paths[CLUSTERS_CSV])
  paths[CLUSTERS_JSON] = write_json(info, out_dir / CLUSTERS_JSON)
  return paths


def read_clusters(out_dir) -> tuple[pd.DataFrame, dict]:
  """Reads clusters.csv and clusters.json (info; {} when absent) of an output directory."""
  out_dir = Path(out_dir)
  csv = out_dir / CLUSTERS_CSV
  if not csv.is_file():
    raise FileNotFoundError(f"no {CLUSTERS_CSV} in {out_dir}: run the head clustering first "
                            f"(`analyze` with distance features, or clustering.cluster_heads + "
                            f"contract.write_clusters)")
  df = pd.read_csv(csv, dtype={"cluster_name": str})
  _check_columns(df, CLUSTER_COLUMNS, str(csv))
  info = read_json(out_dir / CLUSTERS_JSON) if (out_dir / CLUSTERS_JSON).is_file() else {}
  return df, info


def write_parser(df: pd.DataFrame, out_dir) -> Path:
  """Writes parser.csv (`PARSER_COLUMNS`, `heads_jax.hoststats.parsing.parsing_table`)."""
  _check_columns(df, PARSER_COLUMNS, "the parser table")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  _write_csv(df, out_dir / PARSER_CSV)
  return out_dir / PARSER_CSV


def read_parser(out_dir) -> pd.DataFrame | None:
  """parser.csv of an analysis directory, or None when the run has none."""
  csv = Path(out_dir) / PARSER_CSV
  if not csv.is_file():
    return None
  df = pd.read_csv(csv, dtype={"relation": str, "direction": str, "kind": str})
  _check_columns(df, PARSER_COLUMNS, str(csv))
  return df


def write_robustness(out_dir, arrays: Mapping, arcs: pd.DataFrame | None = None) -> Path:
  """Writes robustness.npz: `ROBUSTNESS_KEYS` float32 ``[b, l, h(, 2)]``, ``parse_pred`` int16
  ``[b, l, h, w]`` and ``hidden_norms`` float32 ``[b, l + 1, 3]`` when given, and the arcs table
  (sequence, dependent, head, relation) as ``arc_*`` arrays."""
  missing = [k for k in ROBUSTNESS_KEYS if k not in arrays]
  if missing:
    raise ValueError(f"the second pass's arrays lack {missing}")
  out = {k: np.asarray(arrays[k], np.float32) for k in ROBUSTNESS_KEYS}
  if arrays.get("parse_pred") is not None:
    out["parse_pred"] = np.asarray(arrays["parse_pred"], np.int16)
  if arrays.get("hidden_norms") is not None:  # optional: hoststats.sinks.activation_summary
    out["hidden_norms"] = np.asarray(arrays["hidden_norms"], np.float32)
  if arcs is not None:
    for c in ("sequence", "dependent", "head"):
      out[f"arc_{c}"] = arcs[c].to_numpy(np.int32)
    out["arc_relation"] = arcs["relation"].to_numpy(str).astype(str)
  return _write_npz(Path(out_dir) / ROBUSTNESS_FILE, out)


def read_robustness(out_dir) -> dict | None:
  """robustness.npz as a dict (``arcs``: the arcs table, or None), or None when absent."""
  file = Path(out_dir) / ROBUSTNESS_FILE
  if not file.is_file():
    return None
  with np.load(file, allow_pickle=False) as data:
    out = {k: data[k] for k in data.files if not k.startswith("arc_")}
    out["arcs"] = None
    if "arc_sequence" in data.files:
      out["arcs"] = pd.DataFrame({"sequence": data["arc_sequence"], "dependent": data["arc_dependent"],
                                  "head": data["arc_head"],
                                  "relation": data["arc_relation"].astype(str)})
  return out


def write_summary(summary: Mapping, out_dir) -> Path:
  """Writes summary.json into out_dir."""
  return write_json(summary, Path(out_dir) / SUMMARY_JSON)


def read_summary(out_dir) -> dict:
  """Reads summary.json of an output directory."""
  path = Path(out_dir) / SUMMARY_JSON
  if not path.is_file():
    raise FileNotFoundError(f"no {SUMMARY_JSON} in {out_dir}: compute it with "
                            f"summary.summary_figures + contract.write_summary")
  return read_json(path)


# ---------------------------------------------------------------------------------------------
# typed readers of tests, clusters and summary


@dataclasses.dataclass(frozen=True)
class Tests:
  """tests.csv and the settings of an analysis directory (`load_tests`).

  Attributes:
    table: one row per (layer, head, role), the columns `TEST_COLUMNS` [+ `RULE_COLUMNS`];
      ``assigned`` and the rule decisions are bool.
    settings: settings.json (else tests.json's ``settings``; {} when neither exists).
  """
  table: pd.DataFrame
  settings: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check_test_columns(self.table, "the tests table")

  @property
  def has_rules(self) -> bool:
    """Whether the table has the role rules' columns (`RULE_COLUMNS`)."""
    return set(RULE_COLUMNS) <= set(self.table.columns)

  @property
  def roles(self) -> tuple[str, ...]:
    """The table's roles, in `vocabulary.ROLES` order, then unknown ones in first-seen order."""
    return vocabulary.role_order(self.table["role"].astype(str))

  @property
  def num_layers(self) -> int:
    return int(self.table["layer"].max()) + 1 if len(self.table) else 0

  @property
  def num_heads(self) -> int:
    return int(self.table["head"].max()) + 1 if len(self.table) else 0

  @property
  def rule(self) -> str | None:
    """The rule of the ``assigned`` column (settings ``rule``), or None when not recorded."""
    return self.settings.get("rule")

  @property
  def tau(self) -> float | None:
    return self.settings.get("tau")

  @property
  def alpha(self) -> float | None:
    return self.settings.get("alpha")

  def role(self, role: str) -> pd.DataFrame:
    """The rows of one role (one per head); empty when the run did not test it."""
    return self.table[self.table["role"].astype(str) == role]

  def with_rule(self, rule: str) -> pd.DataFrame:
    """The table with ``assigned`` = the decisions of ``rule`` (its ``assigned_<rule>`` column,
    e.g. "paper" or "calibrated"); a table without that column has only its own rule's."""
    column = f"assigned_{rule}"
    if column in self.table.columns:
      return self.table.assign(assigned=self.table[column].astype(bool))
    if not self.has_rules and self.rule in (None, rule):
      return self.table
    have = [c[len("assigned_"):] for c in self.table.columns if c.startswith("assigned_")]
    raise ValueError(f"this tests table has no decisions of the {rule!r} rule (it has "
                     f"{have or [self.rule]}); re-run the analysis with that rule")


@dataclasses.dataclass(frozen=True)
class Clusters:
  """clusters.csv and clusters.json of an analysis directory (`load_clusters`).

  Attributes:
    table: one row per head, the columns `CLUSTER_COLUMNS`.
    info: the clustering info dict (method, k, names, centroids, stability, ...; {} if absent).
  """
  table: pd.DataFrame
  info: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check_columns(self.table, CLUSTER_COLUMNS, "the clusters table")

  @property
  def features(self) -> np.ndarray:
    """float ``[l*h, d]``: the heads' distance features (`vocabulary.DISTANCE_FEATURES`)."""
    return self.table[list(vocabulary.DISTANCE_FEATURES)].to_numpy(np.float64)

  @property
  def names(self) -> tuple[str, ...]:
    """The cluster names of the heads present, in first-seen order."""
    return tuple(dict.fromkeys(self.table["cluster_name"].astype(str)))

  def name_of(self) -> dict[tuple[int, int], str]:
    """``{(layer, head): cluster_name}``."""
    t = self.table
    return {(int(l), int(h)): str(c) for l, h, c in zip(t["layer"], t["head"], t["cluster_name"])}


# The keys `heads_jax.hoststats.summary.summary_figures` writes that `Summary` exposes as
# attributes (None when the file lacks them).
SUMMARY_SHARE_KEYS = ("share_local", "share_syntactic", "share_delimiter", "share_block",
                      "share_unskilled", "share_syntactic_also_local")


@dataclasses.dataclass(frozen=True)
class Summary:
  """summary.json of an analysis directory (`load_summary`; keys described in
  `heads_jax.hoststats.summary`). ``figures`` is the whole document; the common keys are
  properties, `share` / `for_rule` read a rule's figures."""
  figures: dict

  def get(self, key: str, default=None):
    return self.figures.get(key, default)

  def __getitem__(self, key: str):
    return self.figures[key]

  def __contains__(self, key: str) -> bool:
    return key in self.figures

  num_sequences = property(lambda self: self.figures.get("num_sequences"))
  num_layers = property(lambda self: self.figures.get("num_layers"))
  num_heads = property(lambda self: self.figures.get("num_heads"))
  rule = property(lambda self: self.figures.get("rule"))
  share_unskilled = property(lambda self: self.figures.get("share_unskilled"))
  share_syntactic_also_local = property(
      lambda self: self.figures.get("share_syntactic_also_local"))
  spearman_local_syntactic = property(lambda self: self.figures.get("spearman_local_syntactic"))
  mean_sieve_score = property(lambda self: self.figures.get("mean_sieve_score"))
  share_p_between = property(lambda self: self.figures.get("share_p_between"))
  num_near_uniform_heads = property(lambda self: self.figures.get("num_near_uniform_heads"))

  @property
  def rules(self) -> tuple[str, ...]:
    """The rules with their own figures (``by_rule``), () for a run without rule columns."""
    return tuple(self.figures.get("by_rule") or ())

  def for_rule(self, rule: str | None = None) -> dict:
    """The role figures (shares, ``num_assigned_by_role``, ``num_heads_by_coarse_role``) of
    ``rule``; the top-level figures (the run's own rule) when ``rule`` is None or the run's."""
    if rule is None or rule == self.rule and rule not in self.rules:
      return self.figures
    by_rule = self.figures.get("by_rule") or {}
    if rule not in by_rule:
      raise KeyError(f"summary.json has no figures for rule {rule!r} (has {list(by_rule)})")
    return by_rule[rule]

  def share(self, coarse_role: str, rule: str | None = None) -> float | None:
    """The share of heads with a coarse role (or ``unskilled``) under ``rule``; None when the
    run did not compute it."""
    return self.for_rule(rule).get(f"share_{coarse_role}")

  def num_heads_by_coarse_role(self, rule: str | None = None) -> dict:
    return dict(self.for_rule(rule).get("num_heads_by_coarse_role") or {})

  def num_assigned_by_role(self, rule: str | None = None) -> dict:
    return dict(self.for_rule(rule).get("num_assigned_by_role") or {})


def load_tests(out_dir) -> Tests:
  """tests.csv and the settings of an output directory as a `Tests`."""
  return Tests(*read_tests(out_dir))


def load_clusters(out_dir) -> Clusters:
  """clusters.csv and clusters.json of an output directory as a `Clusters`."""
  return Clusters(*read_clusters(out_dir))


def load_summary(out_dir, missing_ok: bool = False) -> Summary | None:
  """summary.json of an output directory as a `Summary`; with ``missing_ok`` None when absent."""
  if missing_ok and not (Path(out_dir) / SUMMARY_JSON).is_file():
    return None
  return Summary(read_summary(out_dir))


def has_clusters(out_dir) -> bool:
  """Whether an output directory holds clusters.csv."""
  return (Path(out_dir) / CLUSTERS_CSV).is_file()


def write_examples(doc: Mapping, out_dir) -> Path:
  """Writes examples.json (the head view's example maps, DESIGN.md section 4; the document of
  ``hoststats.examples.examples_document``) into out_dir."""
  if doc.get("format") != "heads_jax.examples" or not isinstance(doc.get("heads"), list) \
      or not isinstance(doc.get("sequences"), list):
    raise ValueError("not an examples document: build it with hoststats.examples.examples_document")
  return write_json(doc, Path(out_dir) / EXAMPLES_JSON)


def read_examples(out_dir) -> dict | None:
  """examples.json of an output directory, or None when the run has none."""
  path = Path(out_dir) / EXAMPLES_JSON
  if not path.is_file():
    return None
  doc = read_json(path)
  if not isinstance(doc, dict) or doc.get("format") != "heads_jax.examples":
    raise ValueError(f"{path} is not a heads_jax examples file")
  return doc


# ---------------------------------------------------------------------------------------------
# the before/after comparison


@dataclasses.dataclass
class Comparison:
  """A before/after comparison (tables described in `heads_jax.hoststats.compare`)."""
  sieve_bias: pd.DataFrame
  roles: pd.DataFrame
  clusters: pd.DataFrame | None
  warnings: list[str]
  before_dir: str | None = None
  after_dir: str | None = None
  settings_before: dict = dataclasses.field(default_factory=dict)
  settings_after: dict = dataclasses.field(default_factory=dict)


def write_comparison(comparison: Comparison, out_dir) -> dict[str, Path]:
  """Writes a `Comparison` into out_dir.

  Files: compare_sieve_bias.csv, compare_roles.csv, compare_clusters.csv (only when the
  comparison has cluster changes) and compare.json (directories, settings, warnings).
  """
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {COMPARE_SIEVE_BIAS_CSV: out_dir / COMPARE_SIEVE_BIAS_CSV,
           COMPARE_ROLES_CSV: out_dir / COMPARE_ROLES_CSV}
  _write_csv(comparison.sieve_bias, paths[COMPARE_SIEVE_BIAS_CSV])
  _write_csv(comparison.roles, paths[COMPARE_ROLES_CSV])
  if comparison.clusters is not None:
    paths[COMPARE_CLUSTERS_CSV] = out_dir / COMPARE_CLUSTERS_CSV
    _write_csv(comparison.clusters, paths[COMPARE_CLUSTERS_CSV])
  meta = {"before_dir": str(comparison.before_dir), "after_dir": str(comparison.after_dir),
          "settings_before": comparison.settings_before,
          "settings_after": comparison.settings_after, "warnings": list(comparison.warnings)}
  paths[COMPARE_JSON] = write_json(meta, out_dir / COMPARE_JSON)
  return paths


def read_comparison(out_dir) -> Comparison:
  """Reads what `write_comparison` wrote back into a `Comparison`."""
  out_dir = Path(out_dir)
  if not (out_dir / COMPARE_JSON).is_file():
    raise FileNotFoundError(f"no {COMPARE_JSON} in {out_dir}: run compare.compare_runs + "
                            f"contract.write_comparison first")
  meta = read_json(out_dir / COMPARE_JSON)
  text = {c: str for c in ("roles_before", "roles_after", "gained", "lost")}
  roles = pd.read_csv(out_dir / COMPARE_ROLES_CSV, dtype=text, keep_default_na=False)
  clusters = None
  if (out_dir / COMPARE_CLUSTERS_CSV).is_file():
    clusters = pd.read_csv(out_dir / COMPARE_CLUSTERS_CSV,
                           dtype={"cluster_before": str, "cluster_after": str})
    clusters["changed"] = clusters["changed"].astype(bool)
  return Comparison(
      sieve_bias=pd.read_csv(out_dir / COMPARE_SIEVE_BIAS_CSV), roles=roles, clusters=clusters,
      warnings=list(meta.get("warnings", [])), before_dir=meta.get("before_dir"),
      after_dir=meta.get("after_dir"), settings_before=meta.get("settings_before", {}),
      settings_after=meta.get("settings_after", {}))


# ---------------------------------------------------------------------------------------------
# roles over training


def write_trajectory(df: pd.DataFrame, out_dir) -> Path:
  """Writes the trajectory table (a row per checkpoint: ``step`` first) as trajectory.csv in
  out_dir, through a temporary file (a reader never sees half a table)."""
  if "step" not in df.columns:
    raise ValueError(f"the trajectory table needs a step column; got {list(df.columns)}")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  tmp = out_dir / (TRAJECTORY_CSV + ".tmp")
  _write_csv(df, tmp)
  os.replace(tmp, out_dir / TRAJECTORY_CSV)
  return out_dir / TRAJECTORY_CSV


def read_trajectory(out_dir) -> pd.DataFrame:
  """Reads what `write_trajectory` wrote."""
  path = Path(out_dir) / TRAJECTORY_CSV
  if not path.is_file():
    raise FileNotFoundError(f"no {TRAJECTORY_CSV} in {out_dir}: run heads-jax trajectory first")
  return pd.read_csv(path)
