"""Before/after comparison of two analysis runs, e.g. BERT before and after fine-tuning (host).

`compare_runs(before_dir, after_dir)` reads two analysis output directories (scores.npz,
tests.csv, settings.json and, when both have it, clusters.csv) and returns a
`heads_jax.contract.Comparison` (written and read by `heads_jax.contract.write_comparison` /
`read_comparison`):

* ``sieve_bias``: columns role, layer_group, before, after, delta (= after - before), heads,
  delta_low, delta_high, p_value. For each role common to both runs and each third of the layers
  (Pande et al. Fig. 6; `heads_jax.hoststats.roles.layer_groups`: for 12 layers 0-3 initial,
  4-7 middle, 8-11 final; with fewer than 3 layers the empty groups are left out), the mean of
  every non-NaN sieve bias over the sequences and the heads of the group's layers (each
  (sequence, layer, head) value weighted equally). NaN when the role has no value in the group.
  The change is tested as the reproduce verdicts test it (`heads_jax.hoststats.claims`): the
  heads are the units (the (sequence, head) values are nested): each head's change of its mean
  over the sequences, their mean's 95% t interval (delta_low, delta_high) and a two-sided
  one-sample t-test against no change (p_value) over the ``heads`` with a value in both runs;
  NaN with fewer than 2 heads.
* ``roles``: one row per head: layer, head, roles_before, roles_after, gained, lost, each a
  ';'-joined list of fine role names in the run's role order ('' for none). Only roles tested
  in both runs are compared.
* ``clusters`` (None unless both runs have clusters.csv): layer, head, cluster_before,
  cluster_after (cluster *names*: ids of two independent fits are arbitrary, names are not),
  changed (names differ).
* ``warnings``: the reasons to read the numbers with care (also issued with
  `warnings.warn`).

The sieve bias comparison only means something on the same inputs: the runs must have the
same number of layers and heads (else ValueError) and the same data: same number of
sequences, same ``lengths`` and the same ``data`` / ``num_sequences`` settings when recorded
(else ValueError). Other settings that differ (tau, alpha, test, correction, direction,
max_length, roles, ...; the model, which is what is compared, and a few bookkeeping keys in
``IGNORED_SETTINGS`` excepted) give a warning, as do roles computed in one run only.

Host-only module (numpy, pandas); no jax.
"""

from __future__ import annotations

import warnings as warnings_lib
from typing import Sequence

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.hoststats import roles as roles_lib

SIEVE_BIAS_COLUMNS = ("role", "layer_group", "before", "after", "delta", "heads", "delta_low",
                      "delta_high", "p_value")
ROLES_COLUMNS = ("layer", "head", "roles_before", "roles_after", "gained", "lost")
CLUSTERS_COLUMNS = ("layer", "head", "cluster_before", "cluster_after", "changed")
DATA_SETTINGS = ("data", "num_sequences")
IGNORED_SETTINGS = ("model", "model_path", "checkpoint", "output_dir", "out_dir", "created",
                    "timestamp", "elapsed_s", "version", "git_commit")


def _group_means(sieve_bias: np.ndarray, layers: np.ndarray) -> np.ndarray:
  """nan-mean over sequences, the given layers and heads: float64 ``[r]``."""
  values = np.asarray(sieve_bias, np.float64)[:, layers]
  values = values.reshape(-1, values.shape[-1])
  valid = ~np.isnan(values)
  count = valid.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(valid, values, 0.0).sum(0) / count


def _head_means(sieve_bias: np.ndarray, layers) -> np.ndarray:
  """nan-mean over sequences per head of the given layers: float64 ``[l' * h, r]``."""
  values = np.asarray(sieve_bias, np.float64)[:, layers]
  values = values.reshape(values.shape[0], -1, values.shape[-1])
  with warnings_lib.catch_warnings():
    warnings_lib.simplefilter("ignore", RuntimeWarning)
    return np.nanmean(values, 0)


def change_test(changes) -> dict:
  """The heads' changes ``[n]`` (finite ones read): ``heads``, the 95% t interval of their mean
  (``delta_low``, ``delta_high``) and the two-sided one-sample t-test's ``p_value`` against 0;
  NaN with fewer than 2 heads; with no spread, p is 0 for a non-zero mean and 1 for none."""
  from scipy import stats
  d = np.asarray(changes, np.float64)
  d = d[np.isfinite(d)]
  out = {"heads": int(d.size), "delta_low": np.nan, "delta_high": np.nan, "p_value": np.nan}
  if d.size < 2:
    return out
  mean, sd = float(d.mean()), float(d.std(ddof=1))
  if sd == 0:
    return {**out, "delta_low": mean, "delta_high": mean, "p_value": 0.0 if mean != 0 else 1.0}
  half = float(stats.t.ppf(0.975, d.size - 1)) * sd / np.sqrt(d.size)
  p = float(stats.ttest_1samp(d, 0.0).pvalue)
  return {**out, "delta_low": mean - half, "delta_high": mean + half, "p_value": p}


def sieve_bias_change(before, after, roles: Sequence[str]) -> pd.DataFrame:
  """Change of the mean sieve bias per role and layer third.

  Args:
    before, after: float ``[b, l, h, r]`` on the same inputs (b may differ, l and h may not).
    roles: the r role names of both arrays.
  """
  before = np.asarray(before)
  after = np.asarray(after)
  if before.shape[1:] != after.shape[1:]:
    raise ValueError(f"before has [l, h, r] = {before.shape[1:]} but after has {after.shape[1:]}")
  rows = []
  groups = roles_lib.layer_groups(before.shape[1])
  means = {g: (_group_means(before, layers), _group_means(after, layers))
           for g, layers in groups.items()}
  heads = {g: _head_means(after, layers) - _head_means(before, layers)
           for g, layers in groups.items()}
  for i, role in enumerate(roles):
    for g in groups:
      b, a = means[g][0][i], means[g][1][i]
      rows.append({"role": role, "layer_group": g, "before": b, "after": a, "delta": a - b,
                   **change_test(heads[g][:, i])})
  return pd.DataFrame(rows, columns=list(SIEVE_BIAS_COLUMNS))


def role_changes(tests_before: pd.DataFrame, tests_after: pd.DataFrame,
                 roles: Sequence[str] | None = None) -> pd.DataFrame:
  """Roles gained and lost per head between two tests tables (same layers and heads).

  roles: the roles to compare (default: those in both tables, in `batch.ROLES` order).
  """
  if roles is None:
    common = set(tests_before["role"]) & set(tests_after["role"])
    roles = roles_lib.role_order([r for r in tests_before["role"] if r in common])
  roles = tuple(roles)
  before = tests_before[tests_before["role"].isin(roles)]
  after = tests_after[tests_after["role"].isin(roles)]
  a_before, _ = roles_lib.assignment_array(before, roles)
  a_after, _ = roles_lib.assignment_array(after, roles)
  if a_after.shape != a_before.shape:
    raise ValueError(f"before has {a_before.shape[:2]} (layers, heads) but after has "
                     f"{a_after.shape[:2]}; compare runs of the same architecture")
  l, h = a_before.shape[:2]
  join = lambda mask: ";".join(r for r, m in zip(roles, mask) if m)
  rows = []
  for i in range(l):
    for j in range(h):
      b, a = a_before[i, j], a_after[i, j]
      rows.append({"layer": i, "head": j, "roles_before": join(b), "roles_after": join(a),
                   "gained": join(a & ~b), "lost": join(b & ~a)})
  return pd.DataFrame(rows, columns=list(ROLES_COLUMNS))


def cluster_changes(clusters_before: pd.DataFrame, clusters_after: pd.DataFrame) -> pd.DataFrame:
  """Cluster name per head before and after, and whether it changed."""
  keys = ["layer", "head"]
  left = clusters_before[keys + ["cluster_name"]].rename(columns={"cluster_name": "cluster_before"})
  right = clusters_after[keys + ["cluster_name"]].rename(columns={"cluster_name": "cluster_after"})
  if len(left) != len(right) or set(map(tuple, left[keys].to_numpy())) != set(
      map(tuple, right[keys].to_numpy())):
    raise ValueError("the two clusters.csv files cover different heads; compare runs of the same "
                     "architecture")
  df = left.merge(right, on=keys, how="inner").sort_values(keys).reset_index(drop=True)
  df["changed"] = df["cluster_before"] != df["cluster_after"]
  return df[list(CLUSTERS_COLUMNS)]


def _check_same_data(before: contract.Scores, after: contract.Scores, settings_before: dict,
                     settings_after: dict) -> None:
  if (before.num_layers, before.num_heads) != (after.num_layers, after.num_heads):
    raise ValueError(
        f"the runs have different architectures: before {before.num_layers} layers x "
        f"{before.num_heads} heads, after {after.num_layers} x {after.num_heads}; a before/after "
        f"comparison needs the same model size")
  if before.num_sequences != after.num_sequences:
    raise ValueError(
        f"the runs have different data: {before.num_sequences} sequences before, "
        f"{after.num_sequences} after; rerun both analyses on the same inputs (the sieve bias "
        f"comparison needs the same inputs)")
  if (before.lengths is not None and after.lengths is not None
      and not np.array_equal(before.lengths, after.lengths)):
    raise ValueError("the runs have different data: the sequence lengths differ (other texts, "
                     "tokenizer or max_length); rerun both analyses on the same inputs")
  for key in DATA_SETTINGS:
    if key in settings_before and key in settings_after:
      if contract.to_jsonable(settings_before[key]) != contract.to_jsonable(settings_after[key]):
        raise ValueError(f"the runs have different data: {key} = {settings_before[key]!r} before, "
                         f"{settings_after[key]!r} after; the sieve bias comparison needs the same "
                         f"inputs")


def _settings_warnings(settings_before: dict, settings_after: dict) -> list[str]:
  out = []
  skip = set(IGNORED_SETTINGS) | set(DATA_SETTINGS)
  for key in sorted((set(settings_before) | set(settings_after)) - skip):
    b = contract.to_jsonable(settings_before.get(key))
    a = contract.to_jsonable(settings_after.get(key))
    if b != a:
      out.append(f"setting {key!r} differs: before {b!r}, after {a!r}; the comparison assumes "
                 f"the same inputs and test settings, so read the differences with care")
  return out


def compare_runs(before_dir, after_dir) -> contract.Comparison:
  """Compares two analysis output directories (see the module docstring)."""
  before = contract.read_scores(before_dir)
  after = contract.read_scores(after_dir)
  tests_b, tests_a = contract.load_tests(before_dir), contract.load_tests(after_dir)
  tests_before, settings_before = tests_b.table, tests_b.settings
  tests_after, settings_after = tests_a.table, tests_a.settings
  _check_same_data(before, after, settings_before, settings_after)

  notes = _settings_warnings(settings_before, settings_after)
  common = [r for r in before.roles if r in after.roles]
  only = sorted(set(before.roles) ^ set(after.roles))
  if only:
    notes.append(f"roles computed in only one run are left out of the comparison: {only}")
  if not common:
    raise ValueError(f"the runs have no role in common (before {list(before.roles)}, after "
                     f"{list(after.roles)})")
  sb_before = before.sieve_bias[..., [before.roles.index(r) for r in common]]
  sb_after = after.sieve_bias[..., [after.roles.index(r) for r in common]]
  sieve = sieve_bias_change(sb_before, sb_after, common)
  roles = role_changes(tests_before, tests_after, common)

  clusters = None
  have = [contract.has_clusters(d) for d in (before_dir, after_dir)]
  if all(have):
    clusters = cluster_changes(contract.load_clusters(before_dir).table,
                               contract.load_clusters(after_dir).table)
  elif any(have):
    notes.append(f"{contract.CLUSTERS_CSV} exists in only one run; cluster changes are left out")

  for note in notes:
    warnings_lib.warn(note, stacklevel=2)
  return contract.Comparison(sieve_bias=sieve, roles=roles, clusters=clusters, warnings=notes,
                    before_dir=str(before_dir), after_dir=str(after_dir),
                    settings_before=settings_before, settings_after=settings_after)
