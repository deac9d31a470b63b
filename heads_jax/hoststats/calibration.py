"""The calibrated role rule: a head gets a role only where it beats uniform attention (host, scipy).

DESIGN.md section 3 ("Role rules") is the definition; this module implements it.

**What uniform attention scores.** A head that attends uniformly to the ``n`` real positions of a
sequence (``alpha[t, s] = 1 / n``) has the bare sieve bias ``beta(t) = 1`` for every query with a
non-empty sieve, so its sieve bias is exactly 1 for every bare role (local, prev_local,
next_local, block_plain, cls, sep, delimiter and the syntactic relations), whatever ``n``. The
entropy of each of its rows is ``ln n``, so its entropy-weighted ``block`` score is ``ln n``:
about 3.9 on MRPC pairs, above the paper's tau = 3. `uniform_values` gives these values per
sequence.

**The rules** (per layer, head and role, over the sequences ``i`` whose sieve bias ``x_i`` is not
NaN; ``u_i`` the uniform value of sequence ``i``; every test is the run's one-sample one-sided
test, `hypothesis.one_sample_tests`, Student's t by default):

* ``paper``: assigned when the test of H0 ``mean(x) <= tau`` gives ``p_adjusted < alpha`` (the
  paper's rule, unchanged; ``p_value`` / ``p_adjusted`` of the tests table).
* ``calibrated`` (default): three one-sided tests, each must reject:

  - A (the paper's): H0 ``mean(x) <= tau``, p-value ``p_value``;
  - B (uniform): H0 ``mean(x_i - u_i) <= delta``, p-value ``p_uniform``;
    ``delta = TOLERANCE = 1e-3`` absorbs float32 rounding (a head with exactly uniform
    attention scores ``u_i`` up to about 1e-6, with the same sign in every sequence of a given
    length, which a test against 0 would call significant);
  - C (block only; bare block): H0 ``mean(block_plain_i - 1) <= delta``, p-value
    ``p_block_plain`` (the same test as B on the block_plain column). The entropy factor can lift
    a head above ``ln n`` that puts no more attention on its own sentence than uniform
    attention does; C asks that it does. With C, a head whose mean block_plain is at most 1 is
    never a block head: its statistic is at most ``-delta / se < 0``, so ``p >= 0.5``.

  ``p_calibrated = max(p_value, p_uniform[, p_block_plain])``: the p-value of the
  intersection-union test (Berger 1982) of H0 = "A's or B's (or C's) null holds"; it is a valid
  level-alpha test without any adjustment for the two or three tests inside it. The run's
  multiple-comparison correction (none by default) is applied to ``p_calibrated`` over the
  run's tests exactly as to ``p_value`` (`hypothesis.adjust_p_values`), giving
  ``p_calibrated_adjusted``; assigned when ``p_calibrated_adjusted < alpha`` and the head is not
  near-uniform.

**Near-uniform heads.** With ``H_i`` the mean over the real queries of the natural-log entropy of
a head's attention row in sequence ``i`` (``measures.npz`` ``entropy``), ``kl_i = ln n_i - H_i``
is the mean Kullback-Leibler divergence of the head's rows from uniform attention (nats). A head
is *near-uniform* when the mean of ``kl_i`` over all sequences is below ``NEAR_UNIFORM_NATS`` =
0.1: its rows are on average as spread as uniform attention over more than ``e^-0.1`` = 90% of
the positions (a row uniform over ``m`` of ``n`` positions has ``kl = ln(n / m)``). Near-uniform
heads get no role under the calibrated rule and are reported as near-uniform. Measured: the
heads of a randomly initialised all-MiniLM-L6-v2 have mean kl 0.006-0.011 nats on 200 MRPC pairs
plus 200 UD EWT sentences and beat ``ln n`` on block by a significant but tiny margin (block_plain
1.00-1.06); the real all-MiniLM-L6-v2's heads have 0.24-3.9 nats. Where the entropy was not
computed (no ``measures.npz``), no head is marked near-uniform and the settings say so.

**Windowed layers** (ModernBERT's local layers: query ``t`` sees only the keys ``|s - t| <= w``,
``m_t`` of them). A head there cannot spread over the sequence, only over its window, so
"uniform" means uniform over the keys it can see (``windows``: each layer's half window ``w``,
or None for full attention). Its bare sieve bias is then ``beta(t) = n |S(t) & W(t)| /
(|S(t)| m_t)``: above 1 for every sieve inside the window (``local``: ``n / m_t``), which is
what the window does, not what the head does. `uniform_values` gives, per layer, the exact value
for the roles whose sieve is fixed by positions alone (``local``, ``prev_local``, ``next_local``
and ``cls``). For the roles whose sieve depends on where tokens lie (``block``, ``block_plain``,
``sep``, ``delimiter``, the syntactic relations) the value is not 1 (a sieve that sits inside
the window is favoured by it just as ``local`` is): the device pass computes it per sequence
from the sequence's actual sieves (`sieve_uniform`: the segment layout, the [SEP] positions, the
arcs) and records it in ``scores.npz`` (``uniform`` ``[b, l, r]``, every role, every layer;
``block``: ``mean_t beta(t) ln m_t``). With ModernBERT's local half window of 64, a pair of
two equal segments reads 1.38 (block_plain) and 6.22 (block) at 128 tokens, 1.84 and 8.72 at 384
(against 1 and ``mean_t ln m_t`` = 4.55 / 4.76 were they taken as 1); a relation whose head is
1-3 tokens away reads 3.36 at 384 tokens (``n / m_t``). These values are the calibrated rule's
``u_i`` for windowed layers (`calibrated_columns` ``uniform``); without them (a file written
before they were recorded) `uniform_values`' positional values stand, 1 for the others.
Near-uniform heads compare the entropy with ``mean_t ln m_t`` instead of ``ln n``
(`divergence_from_uniform`), which is exact. So a head that spreads its attention evenly over its
window is near-uniform, not local.

Host-only module (numpy, pandas, scipy via `hypothesis`); no jax.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.data import vocabulary
from heads_jax.hoststats import hypothesis
from heads_jax.hoststats import roles as roles_lib

RULES = roles_lib.RULES   # calibrated, paper, average (hoststats/roles.py)
DEFAULT_RULE = "calibrated"
TOLERANCE = 1e-3
NEAR_UNIFORM_NATS = 0.1
# From the role registry (data/vocabulary.py): roles whose score is bias x row entropy (uniform
# value ln n), and test C's bare twin of each.
ENTROPY_WEIGHTED = vocabulary.ENTROPY_WEIGHTED
BLOCK_PLAIN = vocabulary.PLAIN_TWINS
# The columns `calibrated_columns` adds to the tests table, in this order.
CALIBRATION_COLUMNS = contract.RULE_COLUMNS


def check_rule(rule: str) -> str:
  if rule not in RULES:
    raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
  return rule


def _intervals(n: int, lo, hi):
  """Clip the integer intervals ``[lo, hi]`` (arrays over queries) to ``[0, n - 1]``."""
  return np.maximum(lo, 0), np.minimum(hi, n - 1)


def visible_counts(n: int, window: int | None) -> np.ndarray:
  """int ``[n]``: how many keys each query of a sequence of ``n`` real positions sees (``n``
  everywhere under full attention, the clipped window ``|s - t| <= window`` otherwise)."""
  if window is None:
    return np.full(n, n)
  t = np.arange(n)
  lo, hi = _intervals(n, t - window, t + window)
  return hi - lo + 1


def _window_uniform(n: int, window: int, roles: Sequence[str]) -> np.ndarray:
  """float64 ``[r]``: the sieve bias of attention uniform over each query's window (module
  docstring) in a sequence of ``n`` real positions."""
  t = np.arange(n)
  m = visible_counts(n, window)
  w_lo, w_hi = _intervals(n, t - window, t + window)
  out = np.ones(len(roles))
  for j, name in enumerate(roles):
    role = vocabulary.ROLE_TABLE.get(name)
    if name in ENTROPY_WEIGHTED:
      out[j] = np.log(m).mean()
      continue
    if name == "cls":
      lo, hi = np.zeros(n, int), np.zeros(n, int)
    elif role is not None and role.offsets is not None:
      lo, hi = _intervals(n, t + role.offsets[0], t + role.offsets[1])
    else:
      continue
    size = hi - lo + 1
    valid = size > 0
    if not valid.any():
      out[j] = np.nan
      continue
    both = np.maximum(np.minimum(hi, w_hi) - np.maximum(lo, w_lo) + 1, 0)
    out[j] = (n * both[valid] / (size[valid] * m[valid])).mean()
  return out


def sieve_uniform(sieves, segment_ids, roles: Sequence[str], window: int | None,
                  slots: int = 0) -> np.ndarray:
  """Uniform attention's sieve bias over the keys a head sees, from a batch's actual sieves:
  float64 ``[b * max(slots, 1), r]`` (one row per sequence; NaN where a role's sieve is empty
  for every query).

  A query ``t`` of a sequence of ``n`` real positions sees ``m_t`` keys: those of its sequence
  within ``|s - t| <= window`` (all of them for ``window`` None). Attention uniform over them
  has ``beta(t) = n |S(t) & W(t)| / (|S(t)| m_t)``; an entropy-weighted role (``block``) scores
  ``beta(t) ln m_t``; the sequence's value is the mean over the queries with a non-empty sieve
  (as `heads_jax.stats.sieve_bias`).

  Args:
    sieves: bool ``[b, r, q, k]`` (`heads_jax.sieves.build_sieves`, numpy).
    segment_ids: int ``[b, k]``: 1, 2, ... per sequence of a packed row, 0 on padding (an
      unpacked batch: its attention mask).
    roles: the r role names.
    window: the layer's half window, or None (full attention: 1 and ``ln n``).
    slots: sequences per row of a packed batch (0: unpacked, one per row).
  """
  sieves = np.asarray(sieves, bool)
  seg = np.asarray(segment_ids).astype(np.int64)
  b, r, q, k = sieves.shape
  if seg.shape != (b, k) or q != k:
    raise ValueError(f"segment_ids must be [b, k] = {(b, k)} for sieves {sieves.shape}")
  same = seg[:, :, None] == seg[:, None, :]
  visible = same & (seg[:, None, :] > 0)                                      # [b, q, k]
  n = same.sum(-1)                                   # [b, q]: the query's sequence length
  if window is not None:
    pos = np.arange(k)
    visible &= np.abs(pos[:, None] - pos[None, :])[None] <= int(window)
  m = visible.sum(-1)                                                         # [b, q]
  size = sieves.sum(-1)                                                       # [b, r, q]
  both = (sieves & visible[:, None]).sum(-1)
  ok = (size > 0) & (seg > 0)[:, None]
  with np.errstate(invalid="ignore", divide="ignore"):
    beta = np.where(ok, n[:, None] * both / (size * np.maximum(m, 1)[:, None]), 0.0)
    weighted = np.asarray([r_ in ENTROPY_WEIGHTED for r_ in roles], bool)[None, :, None]
    beta = np.where(weighted, beta * np.log(np.maximum(m, 1))[:, None], beta)
  out = np.full((b, max(int(slots), 1), r), np.nan)
  for j in range(max(int(slots), 1)):
    here = ok & (seg == j + 1)[:, None]                                       # [b, r, q]
    count = here.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
      out[:, j] = np.where(count > 0, np.where(here, beta, 0.0).sum(-1) / count, np.nan)
  return out.reshape(-1, r)


def uniform_values(lengths, roles: Sequence[str], window: int | None = None) -> np.ndarray:
  """What uniform attention over the keys a head sees scores, float64 ``[b, r]``.

  Full attention (``window`` None): ``ln n`` for the entropy-weighted roles (block), 1 for every
  other role. A windowed layer (half window ``window``): the values of the module docstring.

  Args:
    lengths: int ``[b]``, the real positions ``n`` per sequence (``scores.npz`` ``lengths``).
    roles: the r role names.
    window: the layer's half window, or None.
  """
  n = np.asarray(lengths, np.float64).reshape(-1)
  if n.size and n.min() < 1:
    raise ValueError(f"lengths must be >= 1 (real positions per sequence); got min {n.min()}")
  if window is not None:
    table = {int(k): _window_uniform(int(k), int(window), roles) for k in np.unique(n)}
    return np.stack([table[int(k)] for k in n]) if n.size else np.ones((0, len(roles)))
  out = np.ones((n.size, len(roles)))
  for j, r in enumerate(roles):
    if r in ENTROPY_WEIGHTED:
      out[:, j] = np.log(n)
  return out


def uniform_entropy(lengths, window: int | None = None) -> np.ndarray:
  """float64 ``[b]``: the mean row entropy of uniform attention over the keys each query sees,
  ``mean_t ln m_t`` (``ln n`` under full attention)."""
  n = np.asarray(lengths).reshape(-1)
  if window is None:
    return np.log(n.astype(np.float64))
  table = {int(k): np.log(visible_counts(int(k), int(window))).mean() for k in np.unique(n)}
  return np.array([table[int(k)] for k in n], np.float64)


def check_windows(windows, layers: int):
  """``windows`` as a tuple of ``layers`` entries (half window or None); None: all full."""
  if windows is None:
    return (None,) * layers
  windows = tuple(None if w is None else int(w) for w in windows)
  if len(windows) != layers:
    raise ValueError(f"windows must have one entry per layer ({layers}); got {len(windows)}")
  return windows


def windows_from_settings(settings: dict, layers: int):
  """Per layer, the half window or None, from a run's settings (``windowed_layers`` and
  ``window``, written by `apply_rule`); None when the run has no windowed layer."""
  windowed = settings.get("windowed_layers") or []
  if not windowed:
    return None
  return tuple(int(settings["window"]) if i in windowed else None for i in range(layers))


def divergence_from_uniform(entropy, lengths, windows=None) -> np.ndarray:
  """Mean over sequences of ``U_i - H_i`` (nats), float64 ``[l, h]``, with ``U_i`` the entropy of
  uniform attention over the keys the layer's heads see (``uniform_entropy``: ``ln n_i`` under
  full attention).

  Args:
    entropy: float ``[b, l, h]``, the mean row entropy of each head per sequence
      (``measures.npz`` ``entropy``).
    lengths: int ``[b]`` real positions per sequence.
    windows: per layer, the half window of a windowed layer or None (default: all full).
  """
  entropy = np.asarray(entropy, np.float64)
  n = np.asarray(lengths, np.float64).reshape(-1)
  if entropy.ndim != 3 or entropy.shape[0] != n.size:
    raise ValueError(f"entropy must be [b, l, h] with b = len(lengths) = {n.size}; got "
                     f"{entropy.shape}")
  windows = check_windows(windows, entropy.shape[1])
  u = np.stack([uniform_entropy(n.astype(int), w) for w in windows], axis=1)   # [b, l]
  return (u[:, :, None] - entropy).mean(0)


def near_uniform_heads(entropy, lengths, nats: float = NEAR_UNIFORM_NATS,
                       windows=None) -> np.ndarray:
  """bool ``[l, h]``: heads whose mean divergence from uniform attention (over the keys they
  see: ``windows``) is below ``nats``."""
  if not (isinstance(nats, (int, float)) and nats >= 0):
    raise ValueError(f"the near-uniform threshold must be a number >= 0 (nats); got {nats!r}")
  return divergence_from_uniform(entropy, lengths, windows) < nats


def calibrated_columns(sieve_bias, roles: Sequence[str], lengths, p_value, *, alpha: float,
                       test: str = "t", correction: str = "none",
                       p_adjusted=None, near_uniform=None, windows=None,
                       uniform=None) -> pd.DataFrame:
  """The calibrated rule's columns of the tests table, one row per (layer, head, role) in C order
  of ``[l, h, r]`` (the row order of `hypothesis.hypothesis_tests`).

  Args:
    sieve_bias: float ``[b, l, h, r]``, NaN where a sieve is empty.
    roles: the r role names.
    lengths: int ``[b]`` real positions per sequence.
    p_value: float ``[l, h, r]`` (or flat): test A's p-values, H0 mean <= tau.
    alpha, test, correction: as the run's tests.
    p_adjusted: test A's adjusted p-values (for ``assigned_paper``); default: ``p_value``
      adjusted with ``correction``.
    near_uniform: bool ``[l, h]`` or None (not computed: no head is near-uniform).
    windows: per layer, the half window of a windowed layer or None (default: all full):
      the uniform values of windowed layers (`uniform_values`).
    uniform: float ``[b, l, r]``, each sequence's uniform value per layer and role from its
      actual sieves (``scores.npz`` ``uniform``, `sieve_uniform`), or None: `uniform_values`.

  Returns:
    a DataFrame with exactly `CALIBRATION_COLUMNS`: ``uniform`` (mean of ``u_i`` over the
    sequences of the test), ``mean_minus_uniform``, ``statistic_uniform`` and ``p_uniform``
    (test B), ``p_block_plain`` (test C; NaN for other roles), ``p_calibrated``,
    ``p_calibrated_adjusted``, ``near_uniform``, ``assigned_paper``, ``assigned_calibrated``.
  """
  x = np.asarray(sieve_bias, np.float64)
  roles = tuple(roles)
  if x.ndim != 4 or x.shape[3] != len(roles):
    raise ValueError(f"sieve_bias must be [b, l, h, r] with r = {len(roles)}; got {x.shape}")
  b, l, h, r = x.shape
  lengths = np.asarray(lengths).reshape(-1)
  if lengths.size != b:
    raise ValueError(f"lengths must have one entry per sequence ({b}); got {lengths.size}")
  windows = check_windows(windows, l)
  if uniform is not None:
    if np.shape(uniform) != (b, l, r):
      raise ValueError(f"uniform must be [b, l, r] = {(b, l, r)}; got {np.shape(uniform)}")
    u = np.asarray(uniform, np.float64)[:, :, None]                             # [b, l, 1, r]
  else:
    u = np.stack([uniform_values(lengths, roles, w) for w in windows], axis=1)[:, :, None]
  valid = ~np.isnan(x)
  with np.errstate(invalid="ignore", divide="ignore"):
    uniform = np.where(valid, u, 0.0).sum(0) / valid.sum(0)     # [l, h, r], NaN where n = 0
  b_test = hypothesis.one_sample_tests(x - u, TOLERANCE, test)
  p_a = np.asarray(p_value, np.float64).reshape(l, h, r)
  p_plain = np.full((l, h, r), np.nan)
  p_cal = np.fmax(p_a, b_test["p_value"])  # NaN only where both are NaN
  p_cal = np.where(np.isnan(p_a) | np.isnan(b_test["p_value"]), np.nan, p_cal)
  for j, role in enumerate(roles):
    twin = BLOCK_PLAIN.get(role)
    if twin is None:
      continue
    if twin not in roles:
      raise ValueError(f"the calibrated rule for {role!r} needs its bare twin {twin!r} in the run")
    c = hypothesis.one_sample_tests(x[..., roles.index(twin)] - 1.0, TOLERANCE, test)["p_value"]
    p_plain[..., j] = c
    p_cal[..., j] = np.where(np.isnan(c), np.nan, np.fmax(p_cal[..., j], c))
  p_cal_adj = hypothesis.adjust_p_values(p_cal, correction)
  if p_adjusted is None:
    p_adjusted = hypothesis.adjust_p_values(p_a, correction)
  p_adjusted = np.asarray(p_adjusted, np.float64).reshape(l, h, r)
  if near_uniform is None:
    flat = np.zeros((l, h), bool)
  else:
    flat = np.asarray(near_uniform, bool)
    if flat.shape != (l, h):
      raise ValueError(f"near_uniform must be bool [l, h] = {(l, h)}; got {flat.shape}")
  flat3 = np.broadcast_to(flat[:, :, None], (l, h, r))
  paper = np.where(np.isnan(p_adjusted), False, p_adjusted < alpha)
  calibrated = np.where(np.isnan(p_cal_adj), False, p_cal_adj < alpha) & ~flat3
  cols = {
      "uniform": uniform, "mean_minus_uniform": b_test["mean"] + 0.0,
      "statistic_uniform": b_test["statistic"], "p_uniform": b_test["p_value"],
      "p_block_plain": p_plain, "p_calibrated": p_cal, "p_calibrated_adjusted": p_cal_adj,
      "near_uniform": flat3, "assigned_paper": paper, "assigned_calibrated": calibrated,
  }
  df = pd.DataFrame({k: np.asarray(v).reshape(-1) for k, v in cols.items()},
                    columns=list(CALIBRATION_COLUMNS))
  for k in ("near_uniform", "assigned_paper", "assigned_calibrated"):
    df[k] = df[k].astype(bool)
  return df


def apply_rule(tests: pd.DataFrame, settings: dict, sieve_bias, roles: Sequence[str], lengths, *,
               rule: str = DEFAULT_RULE, entropy=None,
               near_uniform_nats: float = NEAR_UNIFORM_NATS,
               windows=None, uniform=None) -> tuple[pd.DataFrame, dict]:
  """Adds the rule columns to a tests table and decides ``assigned`` by ``rule``.

  Args:
    tests, settings: from `hypothesis.hypothesis_tests` on the same ``sieve_bias`` and ``roles``
      (its tau, alpha, test and correction are used).
    sieve_bias: float ``[b, l, h, r]``; lengths: int ``[b]`` (``scores.npz``).
    rule: "calibrated" (default), "paper" (module docstring) or "average" (the mean above tau,
      no test: `heads_jax.hoststats.roles.average_rule`).
    entropy: float ``[b, l, h]`` mean row entropy (``measures.npz``), or None: no head is then
      marked near-uniform.
    near_uniform_nats: the near-uniform threshold (nats).
    windows: per layer, the half window of a windowed layer (ModernBERT's local layers) or None
      (default: every layer full): uniform attention is then over the keys each head sees
      (module docstring; ``heads_jax.model.loading.layer_windows`` reads them from a model).
    uniform: float ``[b, l, r]`` per-sequence uniform values from the actual sieves
      (``scores.npz``; `calibrated_columns`), or None.

  Returns:
    (tests with `contract.TEST_COLUMNS` + `CALIBRATION_COLUMNS`, ``assigned`` =
    ``assigned_<rule>``; settings plus ``rule``, ``uniform_tolerance``, ``near_uniform_nats``,
    ``near_uniform_computed``, ``num_near_uniform_heads``, ``near_uniform_heads`` ("layer:head"
    list)).
  """
  check_rule(rule)
  if tuple(tests.columns) != contract.TEST_COLUMNS:
    raise ValueError(f"apply_rule needs the table of hypothesis.hypothesis_tests (columns "
                     f"{list(contract.TEST_COLUMNS)}); got {list(tests.columns)}")
  sieve_bias = np.asarray(sieve_bias)
  _, l, h, r = sieve_bias.shape
  if len(tests) != l * h * r:
    raise ValueError(f"the tests table has {len(tests)} rows; sieve_bias {sieve_bias.shape} "
                     f"needs {l * h * r}")
  flat = None
  if entropy is not None:
    flat = near_uniform_heads(entropy, lengths, near_uniform_nats, windows)
  extra = calibrated_columns(sieve_bias, roles, lengths, tests["p_value"].to_numpy(),
                             alpha=float(settings["alpha"]), test=settings["test"],
                             correction=settings["correction"],
                             p_adjusted=tests["p_adjusted"].to_numpy(), near_uniform=flat,
                             windows=windows, uniform=uniform)
  out = pd.concat([tests.reset_index(drop=True), extra], axis=1)
  out["assigned"] = roles_lib.rule_assigned(out, rule, settings.get("tau"))
  settings = dict(settings)
  heads = [] if flat is None else [f"{i}:{j}" for i, j in np.argwhere(flat)]
  settings.update(rule=rule, uniform_tolerance=TOLERANCE,
                  near_uniform_nats=float(near_uniform_nats),
                  near_uniform_computed=flat is not None,
                  num_near_uniform_heads=len(heads), near_uniform_heads=heads)
  if windows is not None and any(w is not None for w in windows):
    settings["windowed_layers"] = [i for i, w in enumerate(windows) if w is not None]
    settings["window"] = max(w for w in windows if w is not None)
    settings["window_baselines"] = ("from each sequence's sieves" if uniform is not None else
                                     "positional roles exact, others taken as 1 (a file "
                                     "without the per-sequence baselines)")
  return out, settings


def shares_by_layer_kind(tests: pd.DataFrame, settings: dict, view: str = roles_lib.TESTS) -> dict | None:
  """Role shares of the windowed (local) and the full-attention (global) layers apart, for a run
  with windowed layers (ModernBERT; ``settings`` of `apply_rule`, ``windowed_layers``); None for
  a run without them.

  Returns ``{"local": {...}, "global": {...}}``, each with ``layers`` (their indices),
  ``num_heads``, ``share_<coarse role>`` (of ``view``'s coarse roles: the fraction of the kind's
  heads with that role, by the run's ``assigned``), ``share_unskilled`` and
  ``share_near_uniform`` (heads in ``near_uniform_heads``). Only the attention-weighted rows of a
  table that also holds norm-weighted ones are read.
  """
  windowed = set(settings.get("windowed_layers") or [])
  if not windowed:
    return None
  if "weighting" in tests.columns:
    tests = tests[tests["weighting"] == "attention"]
  assigned, roles = roles_lib.assignment_array(tests)
  coarse, names = roles_lib.coarse_roles(assigned, roles, view)
  l, h = assigned.shape[:2]
  flat = np.zeros((l, h), bool)
  for spec in settings.get("near_uniform_heads") or []:
    i, j = (int(x) for x in spec.split(":"))
    flat[i, j] = True
  out = {}
  for kind, layers in (("local", sorted(windowed)), ("global", [i for i in range(l) if i not in windowed])):
    n = len(layers) * h
    part = {"layers": layers, "num_heads": n}
    for c_i, c in enumerate(names):
      part[f"share_{c}"] = float(coarse[layers, :, c_i].sum() / n) if n else None
    part["share_unskilled"] = float((~coarse[layers].any(-1)).sum() / n) if n else None
    part["share_near_uniform"] = float(flat[layers].sum() / n) if n else None
    out[kind] = part
  return out
