"""Statistics kernel v2, the tile: one block of queries of one head against all keys, in plain
``jax.numpy`` (issue 38; the plan ``../shared/plans/accelerator.md`` section 2.1).

``tile_values`` takes the block's queries ``q [T, e]``, all keys ``k [K, e]`` and per-position
integer tables, recomputes the scores and returns, per query row, the value of every output
channel (``[T, 1]`` each): every role's sieve sum (divided by the row's mass, times the row
entropy for ``block``), Guan's 21 distance features and the measures. No ``[T, K]`` array
leaves it; the wrappers (``heads_jax.stats.kernel``: Pallas on GPU (Triton) and on TPU (Mosaic),
a ``lax.map`` over query blocks on the CPU) multiply each channel by its per-query weight
(``heads_jax.stats.kernel.kernel_tables``, the same weights as ``heads_jax.stats.layerwise``) and
add over the rows. The arithmetic on the ``[T, K]`` tile:

* softmax: ``s = q k^T / sqrt(e)`` (float32 accumulation; ``HIGHEST`` for float32 inputs),
  padding keys pushed to ``-1e30``, ``x = s - max``, ``ex = exp(x)``, ``Z = sum ex``. Nothing is
  divided per element: every sum below is taken over ``ex`` and divided by ``Z`` per row;
* entropy ``H = ln Z - sum ex x / Z`` (float32, no logarithm per element; absolute error about
  5e-7 where ``ln Z + m - sum p s`` cancels to 4e-5, plan section 2.3), so ``block`` needs no
  extra pass;
* one contraction ``ex @ E`` with ``E [K, 64]``, built once per block for all its heads
  (``block_setup``): the key-column features (row mass, [CLS] position, [SEP], ``,``, ``.``, the
  two block columns, [CLS] class, delimiter) in columns 0..8, each non-special key's window at
  its nearest row of the block in columns 16..31, and the near keys ``t0 - 2 .. t0 + T + 1``
  each in its own column (32..63). ``ex`` enters the contraction as two bfloat16 halves
  (``hi + lo``, E exact in bfloat16): 1.8e-6 where bf16 alone misses 1e-3 (plan section 2.3);
  ``contraction="float32"`` takes one float32 dot instead;
* the 16 distance windows ``min(15, floor(16 |s - t| / n))`` as that base plus
  ``J(n) = min(15, ceil(16 (T - 1) / n))`` threshold corrections ``(ex * [|s - t| >=
  theta_j(s)]) @ D_j`` (``window_masks``; exact, ``tests/stats/test_kernel.py`` checks the
  decomposition against the direct windows): over T rows a key's window only grows from its
  nearest row's, by at most J steps, so each correction is one compare and a select per half;
  the first ``STATIC_CORRECTIONS`` are built once per block and skipped past J(n), further ones
  (sequences shorter than ``16 (T - 1) / 4``) are built in a loop;
* the offsets ``-2..2`` (local, prev/next local, self, prev/next token): ``p[t, t + o]`` is the
  near column ``t - t0 + o + 2`` of row t, a pick on the small ``[T, 64]`` result;
* the dependency roles: one mask ``word(s) == head(t)`` shared by the relations and
  ``syntactic`` (``dep2head``); ``both`` adds one union mask per role.

``head_rows_blocked`` runs the same arithmetic over blocks of keys (two passes: the row maximum
and Z, then every sum with that maximum; every result is a sum over keys divided by Z), for
sequences whose keys a program cannot hold at once.

Per attention element that is 16 tile operations plus 3 per window correction (22 for a
128-position sequence at T = 16; the first kernel had 83 plus 26 row reductions;
``tests/stats/test_kernel.py`` counts them in the jaxpr).

Definitions are those of ``heads_jax.stats.sieve_bias``, ``distance`` and ``measures`` (DESIGN.md
section 3), value for value the same channels as the first fused kernel
(``heads_jax.stats.fused``): ``tests/stats/test_kernel.py`` checks them against the ``stacked``
path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from heads_jax.data import vocabulary as vocab
from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_COMMA, TOKEN_OTHER, TOKEN_PERIOD, TOKEN_SEP
from heads_jax.sieves import NUM_WINDOWS

# Columns of the key table E (float32 [K, E_COLS]): the key features, then the window one-hot
# (WIN0..WIN0+15, set in the tile), then the near keys' own columns (NEAR0.., set in the tile).
(E_REAL, E_POS0, E_SEP, E_COMMA, E_PERIOD, E_BLOCK0, E_BLOCK1, E_CLS, E_DELIM) = range(9)
WIN0 = 16
NEAR0 = WIN0 + NUM_WINDOWS
NEAR_COLS = 32
E_COLS = NEAR0 + NEAR_COLS
# Columns of the query table: class, token type, word (-2 where none), head word (-2 where
# none), relation, n (real positions of the query's sequence; of the row's longest on padding),
# segment (the query's sequence in a packed row, 1, 2, ...; -1 on padding).
Q_CLASS, Q_TYPE, Q_WORD, Q_HEAD, Q_REL, Q_N, Q_SEG = range(7)
Q_COLS = 8
# Rows of the key table: real, other (real and not special: a window key), word (-3 where
# none), head word (-3 where none), relation, segment (0 on padding), n (the real positions of
# the key's sequence, at least 1).
K_REAL, K_OTHER, K_WORD, K_HEAD, K_REL, K_SEG, K_N = range(7)
K_ROWS = 8
# The offsets' band |s - t| <= BAND: the keys t0 - BAND .. t0 + T + BAND - 1 of a block each
# have their own column (NEAR0 + s - t0 + BAND), so a block has at most NEAR_COLS - 2 BAND rows.
BAND = 2
MAX_ROWS = NEAR_COLS - 2 * BAND
# Columns of a head's per-row results (``head_rows``) free in E: the row entropy, the
# dependency sums (one for dep2head, one per relation role for both).
R_ENTROPY = 9
R_RELATION = 10
# The last free column: where the key loop keeps each row's log-sum-exp between its passes
# (``head_rows_blocked``; the dependency sums stop before it: at most 5 relation roles).
R_LSE = WIN0 - 1
# Window corrections unrolled (each skipped where J(n) is smaller); more run in a loop that
# builds its right-hand side per head (sequences shorter than 16 (T - 1) / STATIC_CORRECTIONS).
STATIC_CORRECTIONS = 4
# The registry's kernel codes this tile implements.
KERNEL_CODES = (vocab.KERNEL_OFFSETS, vocab.KERNEL_BLOCK, vocab.KERNEL_KEYS, vocab.KERNEL_RELATION)
KEY_COLUMNS = {frozenset({vocab.KEY_POSITION0}): E_POS0, frozenset({vocab.KEY_SEP}): E_SEP,
               frozenset({vocab.KEY_POSITION0, vocab.KEY_SEP}): E_DELIM}
_NEG = -1e30          # a padding key's score (finite: 0 * x stays 0)
_NEVER = 1 << 30      # a threshold no distance reaches
CONTRACTIONS = ("hilo", "float32")


def window_of(d, n):
  """Guan's window ``min(15, floor(16 d / n))`` of distances ``d >= 0`` (int), ``n >= 1`` real
  positions; float arithmetic (Mosaic has no vector integer division), exact while
  ``16 d < 2**22``: the ``+ 0.25`` keeps ``16 d = m n`` on the right side of the floor."""
  d = jnp.asarray(d)
  w = jnp.floor((NUM_WINDOWS * d.astype(jnp.float32) + 0.25) / jnp.asarray(n, jnp.float32))
  return jnp.minimum(w, NUM_WINDOWS - 1).astype(jnp.int32)


def corrections(n, rows: int):
  """``J(n) = min(15, ceil(16 (rows - 1) / n))``: how far a key's window can move over ``rows``
  consecutive queries of a sequence of ``n`` real positions (int32 scalar)."""
  n = jnp.maximum(jnp.asarray(n, jnp.int32), 1)
  return jnp.minimum(NUM_WINDOWS - 1, (NUM_WINDOWS * (rows - 1) + n - 1) // n)


def _ceil16(x):
  """ceil(x / 16) of non-negative int32 ``x`` (a shift: no integer division)."""
  return jnp.right_shift(x + (NUM_WINDOWS - 1), 4)


def window_base(kpos, t0, n, rows: int):
  """Each key's window at its nearest row of the block ``t0 .. t0 + rows - 1`` (int32, the
  shape of ``kpos``): over the block's rows the window of (t, s) only grows from there, by at
  most ``corrections(n, rows)`` steps (0 for keys inside the block: their nearest distance is 0)."""
  near = jnp.maximum(jnp.maximum(t0 - kpos, kpos - (t0 + rows - 1)), 0)
  return window_of(near, n)


def window_threshold(base, j, n):
  """The distance from which the window of (t, s) is at least ``base + j`` (``j >= 1``):
  ``ceil((base + j) n / 16)``, or ``_NEVER`` past window 15."""
  target = base + j
  return jnp.where(target <= NUM_WINDOWS - 1, _ceil16(target * n), _NEVER)


def window_masks(t0, n, rows: int, keys: int):
  """The decomposition of the distance windows, as ``(E0, terms)`` for the queries
  ``t0 .. t0 + rows - 1`` and keys ``0 .. keys - 1`` of a sequence of ``n`` real positions, all
  keys counted (the tile zeroes the special ones): ``onehot(window(t, s)) = E0[s] +
  sum_j mask_j[t, s] * D_j[s]`` with ``mask_j = |s - t| >= threshold_j(s)``; ``E0`` and ``D_j``
  float32 ``[keys, 16]``, ``mask_j`` bool ``[rows, keys]``. For tests and for reading; the tile
  computes the same in place."""
  kpos = jnp.arange(keys, dtype=jnp.int32)
  base = window_base(kpos, t0, n, rows)
  dist = jnp.abs(kpos[None, :] - (t0 + jnp.arange(rows, dtype=jnp.int32))[:, None])
  onehot = lambda w: (w[:, None] == jnp.arange(NUM_WINDOWS)).astype(jnp.float32)  # noqa: E731
  terms = []
  for j in range(1, int(corrections(n, rows)) + 1):
    mask = dist >= window_threshold(base, j, n)[None, :]
    terms.append((mask, onehot(base + j) - onehot(base + j - 1)))
  return onehot(base), terms


def kernel_rows(roles: Sequence[str], key_columns: dict, kernel: str, where: str) -> tuple:
  """The registry rows (``heads_jax.data.vocabulary.Role``) of ``roles``; a clear ValueError for
  a role whose kernel code (``KERNEL_CODES``) or key set (a key of ``key_columns``) the
  ``kernel`` (its name in the message; ``where``: its file) does not implement."""
  out = tuple(vocab.role(r) for r in roles)
  for role in out:
    if role.kernel not in KERNEL_CODES:
      raise ValueError(f"role {role.name!r} has kernel code {role.kernel}, which the {kernel} "
                       f"does not implement (it knows {KERNEL_CODES}); use "
                       f"stats_impl='layerwise' or add the code to {where}")
    if role.kernel == vocab.KERNEL_KEYS and frozenset(role.keys) not in key_columns:
      raise ValueError(f"role {role.name!r}: the {kernel} has no column for the key set "
                       f"{sorted(role.keys)}; use stats_impl='layerwise' or add it to {where}")
  return out


def tile_roles(roles: Sequence[str]) -> tuple:
  """``kernel_rows`` of the tile (its ``KEY_COLUMNS``)."""
  return kernel_rows(roles, KEY_COLUMNS, "statistics kernel", "heads_jax/stats/tile.py KEY_COLUMNS")


def block_setup(k_rows, k_cols, e_table, n, t0, rows: int, contraction: str = "hilo", *,
                s0=0, static: int = STATIC_CORRECTIONS) -> dict:
  """What every head of a query block shares (built once per block, not per head): the
  contraction's right-hand side ``[K, E_COLS]`` (key features, each key's base window, the near
  keys' own columns), the distances ``|s - t|`` ``[T, K]`` and the first ``static`` window
  corrections (threshold row ``[1, K]``, right-hand side ``[K, 16]``).

  Args as ``tile_values``; ``rows`` the block's query rows T (at most ``MAX_ROWS``); the tables
  may be one block of keys, ``s0 .. s0 + K - 1`` (``head_rows_blocked``; ``s0`` an int32 scalar)."""
  if rows > MAX_ROWS:
    raise ValueError(f"a block has at most {MAX_ROWS} query rows (NEAR_COLS - 2 BAND), got {rows}")
  if contraction not in CONTRACTIONS:
    raise ValueError(f"contraction must be one of {CONTRACTIONS}, got {contraction!r}")
  f32, i32 = jnp.float32, jnp.int32
  dtype = jnp.bfloat16 if contraction == "hilo" else f32
  keys = e_table.shape[0]
  n = jnp.min(jnp.maximum(jnp.asarray(n, i32), 1))        # a scalar, or the rows' Q_N [T, 1]
  # each key's window by its own sequence's length (a packed row's keys of other sequences are
  # masked out of the scores; over the rows of its own sequence a key's window grows from its
  # nearest row's by at most J(n) steps, n the block's shortest: exact for every sequence)
  kn_c, kn_r = jnp.maximum(k_cols[K_N], 1), jnp.maximum(k_rows[K_N], 1)
  kpos_c = s0 + jax.lax.broadcasted_iota(i32, (keys, 1), 0)
  kpos_r = s0 + jax.lax.broadcasted_iota(i32, (1, keys), 1)
  qpos = t0 + jax.lax.broadcasted_iota(i32, (rows, 1), 0)
  base_c = window_base(kpos_c, t0, kn_c, rows)                            # [K, 1]
  base_r = window_base(kpos_r, t0, kn_r, rows)                            # [1, K]
  other_c = k_cols[K_OTHER] > 0
  lane = jax.lax.broadcasted_iota(i32, (keys, E_COLS), 1)
  near = kpos_c - (t0 - BAND)
  in_near = (near >= 0) & (near < rows + 2 * BAND)
  rhs = (e_table + ((lane == WIN0 + base_c) & other_c).astype(f32)
         + ((lane == NEAR0 + near) & in_near).astype(f32))
  onehot = lambda w: ((lane == WIN0 + w) & other_c).astype(f32)          # noqa: E731 [K, 64]
  corrections_ = []
  for j in range(1, static + 1):
    corrections_.append((window_threshold(base_r, j, kn_r),
                         (onehot(base_c + j) - onehot(base_c + j - 1)).astype(dtype)))
  return {"rhs": rhs.astype(dtype), "dist": jnp.abs(kpos_r - qpos), "static": corrections_,
          "base_c": base_c, "base_r": base_r, "onehot": onehot, "n": kn_r, "t0": t0,
          "rows": rows, "contraction": contraction, "jn": corrections(n, rows)}


def key_mask(q_info, k_rows, packed: bool):
  """The keys each row attends: real keys (``[1, K]``), or in a ``packed`` row the keys of the
  row's own sequence (``[T, K]``: one compare per element)."""
  if packed:
    return k_rows[K_SEG] == q_info[Q_SEG]
  return k_rows[K_REAL] > 0


def scores(q, k, k_real, scale: float):
  """The block's scores ``q k^T * scale``, float32 ``[T, K]`` (``HIGHEST`` for float32 inputs),
  keys where ``k_real`` (``key_mask``, or int32 ``[1, K]``) is 0/False pushed to ``-1e30``."""
  f32 = jnp.float32
  exact = jnp.dtype(q.dtype) == f32
  if math.frexp(scale)[0] == 0.5:     # a power of two: exact in q's dtype, no pass over the tile
    q, scale = q * jnp.asarray(scale, q.dtype), None
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=f32,
                          precision=jax.lax.Precision.HIGHEST if exact else None)
  if scale is not None:
    s = s * scale
  return jnp.where(k_real if k_real.dtype == jnp.bool_ else k_real > 0, s, _NEG)


def row_sums(ex, x, setup: dict, q_info, k_rows, *, roles: tuple, direction: str):
  """The sums over the setup's keys that ``head_rows`` divides by Z, float32 ``[T, E_COLS]``:
  the contraction ``ex @ rhs`` with the window corrections, ``sum ex x`` in column
  ``R_ENTROPY`` and the dependency sums in ``R_RELATION..``; ``ex = exp(x)`` ``[T, K]`` with
  ``x`` the scores less the row maximum (over all keys: a sum over key blocks adds up)."""
  f32 = jnp.float32
  rows = ex.shape[0]
  n, contraction = setup["n"], setup["contraction"]
  if contraction == "hilo":
    hi = ex.astype(jnp.bfloat16)
    halves = (hi, (ex - hi.astype(f32)).astype(jnp.bfloat16))
  else:
    halves = (ex,)
  zero = jnp.zeros((), halves[0].dtype)

  def contract(mask, rhs):
    """``(ex [* mask]) @ rhs`` in float32 ``[T, C]`` (rhs in the halves' dtype)."""
    out = None
    for half in halves:
      a = half if mask is None else jnp.where(mask, half, zero)
      part = jax.lax.dot_general(a, rhs, (((1,), (0,)), ((), ())), preferred_element_type=f32,
                                 precision=jax.lax.Precision.HIGHEST if a.dtype == f32 else None)
      out = part if out is None else out + part
    return out

  feats = contract(None, setup["rhs"])                                     # [T, E_COLS]
  # the window corrections: those a block of this sequence needs (J(n)) of the static ones,
  # then any further ones with their right-hand side built here
  dist, jn = setup["dist"], setup["jn"]
  for j, (threshold, rhs_j) in enumerate(setup["static"], start=1):
    feats = jax.lax.cond(j <= jn, lambda w, t=threshold, r=rhs_j: w + contract(dist >= t, r),
                         lambda w: w, feats)
  base_c, base_r, onehot = setup["base_c"], setup["base_r"], setup["onehot"]

  def correct(j, w):
    rhs_j = (onehot(base_c + j) - onehot(base_c + j - 1)).astype(halves[0].dtype)
    return w + contract(dist >= window_threshold(base_r, j, n), rhs_j)

  feats = jax.lax.fori_loop(len(setup["static"]) + 1, jn + 1, correct, feats)
  lane = jax.lax.broadcasted_iota(jnp.int32, (rows, E_COLS), 1)
  out = jnp.where(lane == R_ENTROPY, jnp.sum(ex * x, axis=1, keepdims=True), feats)

  # dependency roles (registry kind SIEVE_RELATION: the union of the role's relations)
  krow, qcol = k_rows.__getitem__, q_info.__getitem__
  relation_roles = [r for r in roles if r.kernel == vocab.KERNEL_RELATION]
  if relation_roles:
    head_piece = krow(K_WORD) == qcol(Q_HEAD)                              # s in t's head word
    masked = lambda where: jnp.sum(jnp.where(where, ex, 0.0), axis=1, keepdims=True)  # noqa: E731
    if direction == "dep2head":
      out = jnp.where(lane == R_RELATION, masked(head_piece), out)
    else:
      dependent = krow(K_HEAD) == qcol(Q_WORD)                             # s's word depends on t's
      for i, r in enumerate(relation_roles):
        fwd, rev = _is_rel(qcol(Q_REL), r.relations), _is_rel(krow(K_REL), r.relations)
        out = jnp.where(lane == R_RELATION + i,
                        masked((head_piece & fwd) | (dependent & rev)), out)
  return out


def finish_rows(sums, z):
  """``row_sums`` (added over key blocks) ``[T, E_COLS]`` and the rows' ``Z = sum exp(x)``
  ``[T, 1]`` -> ``head_rows``' results: every sum divided by Z, the entropy ``ln Z - sum ex x /
  Z`` in ``R_ENTROPY``."""
  inv_z = 1.0 / z
  lane = jax.lax.broadcasted_iota(jnp.int32, sums.shape, sums.ndim - 1)
  return jnp.where(lane == R_ENTROPY, jnp.log(z) - sums * inv_z, sums * inv_z)


def head_rows(q, k, setup: dict, q_info, k_rows, *, roles: tuple, direction: str,
              scale: float, packed: bool = False):
  """One head's per-row results of a block, float32 ``[T, E_COLS]``: the contraction divided by
  Z (key features, windows with their corrections, near keys), the row entropy in column
  ``R_ENTROPY`` and the dependency sums in ``R_RELATION..`` (one for ``dep2head``, one per
  relation role for ``both``). ``channel_values`` turns them into the output channels. All keys
  at once (``head_rows_blocked``: block by block). ``packed``: the rows hold several sequences
  (``key_mask``)."""
  s = scores(q, k, key_mask(q_info, k_rows, packed), scale)
  x = s - jnp.max(s, axis=1, keepdims=True)
  ex = jnp.exp(x)                                                          # [T, K], max 1
  z = jnp.sum(ex, axis=1, keepdims=True)                                   # >= 1
  return finish_rows(row_sums(ex, x, setup, q_info, k_rows, roles=roles, direction=direction), z)


def check_blocked(roles: tuple) -> None:
  """The key loop's column ``R_LSE`` must stay free of dependency sums: a clear ValueError for
  more relation roles than the columns before it hold."""
  if sum(r.kernel == vocab.KERNEL_RELATION for r in roles) > R_LSE - R_RELATION:
    raise ValueError(f"the key loop keeps at most {R_LSE - R_RELATION} relation roles' sums "
                     f"(columns R_RELATION..R_LSE of heads_jax/stats/tile.py)")


def key_block_lse(q, load_keys, blocks, q_info, *, scale: float, packed: bool = False):
  """The first pass over key blocks: each row's ``ln sum_s exp(s)`` over the real keys, float32
  ``[T, 1]`` (a running maximum and its rescaled sum); ``load_keys`` as ``head_rows_blocked``."""
  rows = q.shape[0]
  f32 = jnp.float32

  def step(i, carry):
    m, z = carry
    kb, kr, _, _ = load_keys(i)
    s = scores(q, kb, key_mask(q_info, kr, packed), scale)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    return m_new, z * jnp.exp(m - m_new) + jnp.sum(jnp.exp(s - m_new), axis=1, keepdims=True)

  m, z = jax.lax.fori_loop(0, blocks, step, (jnp.full((rows, 1), _NEG, f32),
                                             jnp.zeros((rows, 1), f32)))
  return m + jnp.log(z)


def key_block_sums(q, k, setup: dict, lse, q_info, k_rows, *, roles: tuple, direction: str,
                   scale: float, packed: bool = False):
  """The second pass on one key block (its ``block_setup(..., s0=...)``): ``row_sums`` of the
  probabilities ``p = exp(x)``, ``x = s - lse`` (already divided by Z), float32 ``[T, E_COLS]``;
  column ``R_LSE`` stays 0."""
  x = scores(q, k, key_mask(q_info, k_rows, packed), scale) - lse
  return row_sums(jnp.exp(x), x, setup, q_info, k_rows, roles=roles, direction=direction)


def finish_blocked(sums):
  """The key blocks' added ``key_block_sums`` -> ``head_rows``' results: the entropy
  ``-sum p x`` in ``R_ENTROPY``, column ``R_LSE`` 0."""
  lane = jax.lax.broadcasted_iota(jnp.int32, sums.shape, sums.ndim - 1)
  return jnp.where(lane == R_ENTROPY, -sums, jnp.where(lane == R_LSE, 0.0, sums))


def head_rows_blocked(q, load_keys, blocks, block_k: int, q_info, n, t0, *, roles: tuple,
                      direction: str, scale: float, contraction: str = "hilo",
                      packed: bool = False):
  """``head_rows`` over the keys block by block, for sequences whose keys a program cannot hold
  at once: every result is a sum over keys divided by Z (the entropy ``ln Z - sum ex x / Z``
  too), so two passes do it: each row's log-sum-exp over the key blocks (``key_block_lse``),
  then ``row_sums`` of each block's probabilities (``key_block_sums``), added.

  Args:
    q: ``[T, e]`` the block's queries (rows ``t0 ..``).
    load_keys: ``load_keys(i) -> (k [BK, e], k_rows, k_cols, e_table [BK, E_COLS])`` of key block
      i (keys ``i BK .. (i + 1) BK - 1``; tables as ``tile_values``'), i an int32 scalar.
    blocks: how many key blocks (int or int32 scalar); block_k: BK.
    q_info, n, t0, roles, direction, scale, contraction: as ``tile_values``.

  Returns:
    float32 ``[T, E_COLS]``, as ``head_rows`` on all the keys (to float32 rounding).
  """
  check_blocked(roles)
  lse = key_block_lse(q, load_keys, blocks, q_info, scale=scale, packed=packed)

  def step(i, acc):
    kb, kr, kc, et = load_keys(i)
    setup = block_setup(kr, kc, et, n, t0, q.shape[0], contraction, s0=i * block_k, static=0)
    return acc + key_block_sums(q, kb, setup, lse, q_info, kr, roles=roles, direction=direction,
                                scale=scale, packed=packed)

  sums = jax.lax.fori_loop(0, blocks, step, jnp.zeros((q.shape[0], E_COLS), jnp.float32))
  return finish_blocked(sums)


def _is_rel(x, rels):
  return functools.reduce(jnp.logical_or, [x == r for r in rels])


def role_values(roles: tuple, diag, own_block, key_column, rel_values: dict, entropy,
                inv_total) -> list:
  """Each role's channel per row from a kernel's pieces (registry rows, dispatched on the kernel
  code; ``kernel_rows`` checked them): ``diag(o)`` the row's ``p[t, t + o]``, ``own_block`` its
  mass on its own segment's block, ``key_column(frozenset(keys))`` its mass on a key set,
  ``rel_values[name]`` a relation role's sum; times the row entropy for entropy-weighted roles,
  times ``inv_total`` (1 / the row's mass)."""
  values = []
  for r in roles:
    if r.kernel == vocab.KERNEL_OFFSETS:
      lo, hi = r.offsets
      v = functools.reduce(lambda a, o: a + diag(o), range(lo + 1, hi + 1), diag(lo))
    elif r.kernel == vocab.KERNEL_BLOCK:
      v = own_block
    elif r.kernel == vocab.KERNEL_KEYS:
      v = key_column(frozenset(r.keys))
    else:
      v = rel_values[r.name]
    if r.entropy_weighted:
      v = v * entropy
    values.append(v * inv_total)
  return values


def channel_values(raw, q_info, row, *, roles: tuple, direction: str, measures: bool) -> list:
  """The output channels per row from ``head_rows``' results ``raw`` ``[..., T, E_COLS]``, the
  rows' query table ``q_info`` (int32 ``[..., T, 1]`` each) and each row's index in its block
  ``row`` (int32 ``[..., T, 1]``): a list of float32 ``[..., T, 1]`` in the order of
  ``heads_jax.stats.fused.num_channels`` (``tile_values``). Plain arithmetic on small arrays:
  it runs in a kernel or, on the kernel's output rows, in XLA."""
  f32 = jnp.float32
  col = jnp.split(raw, E_COLS, axis=-1)                                    # [..., T, 1] each
  lane = jax.lax.broadcasted_iota(jnp.int32, raw.shape, raw.ndim - 1)

  @functools.lru_cache(maxsize=None)
  def diag(o):
    """``p[t, t + o]`` (0 where t + o is no key: its near column holds no key)."""
    pick = lane == NEAR0 + row + (o + BAND)
    return jnp.sum(jnp.where(pick, raw, 0.0), axis=-1, keepdims=True)

  qcls, qtype = q_info[Q_CLASS], q_info[Q_TYPE]
  total = col[E_REAL]
  inv_total = 1.0 / jnp.where(total > 0, total, 1.0)
  entropy = col[R_ENTROPY]
  relation_roles = [r for r in roles if r.kernel == vocab.KERNEL_RELATION]
  if direction == "dep2head":
    rel_values = {r.name: col[R_RELATION] * _is_rel(q_info[Q_REL], r.relations).astype(f32)
                  for r in relation_roles}
  else:
    rel_values = {r.name: col[R_RELATION + i] for i, r in enumerate(relation_roles)}
  values = role_values(roles, diag, jnp.where(qtype == 0, col[E_BLOCK0], col[E_BLOCK1]),
                       lambda keys: col[KEY_COLUMNS[keys]], rel_values, entropy, inv_total)
  # distance features: windows over keys that are neither special nor t (t itself is in window
  # 0 of the contraction when it is a window key: taken out), self, then the special keys but t
  d0 = diag(0)
  is_q = lambda c: (qcls == c).astype(f32)                                 # noqa: E731
  windows = [col[WIN0 + w] for w in range(NUM_WINDOWS)]
  windows[0] = windows[0] - d0 * is_q(TOKEN_OTHER)
  c_cls, c_sep, c_comma, c_period = col[E_CLS], col[E_SEP], col[E_COMMA], col[E_PERIOD]
  values += windows + [d0, c_cls - d0 * is_q(TOKEN_CLS), c_sep - d0 * is_q(TOKEN_SEP),
                       c_comma - d0 * is_q(TOKEN_COMMA), c_period - d0 * is_q(TOKEN_PERIOD)]
  if measures:
    values += [entropy, entropy, c_cls, c_sep, c_comma + c_period, diag(-1), diag(1)]
  return values


# ------------------------------------------------------------------------------------------------
# The epilogue (issue 50 item 1): a head's per-row results -> its query block's weighted sums, in
# the kernel (one product and one row sum), so a program writes a few partial sums, not rows

# The lanes of the epilogue's row table X where each row's offsets p[t, t + o] (o = -BAND..BAND)
# are put (over near columns, which X no longer needs): ``diagonals_in_place``.
def diag_lane(o: int) -> int:
  return NEAR0 + o + BAND


# Rows of the epilogue's factor table: 1 where a part is divided by the row's mass, 1 where it is
# multiplied by the row's entropy (the entropy-weighted roles).
F_MASS, F_ENTROPY = range(2)
FACTOR_ROWS = 2
# A part's per-query indicator (times its channel's weight, ``kernel.kernel_tables``): every
# query; the query's token type 0 / not 0 (``block``'s own segment's column); the query's
# relation in a role's set (``dep2head``); the query of a token class (the distance features
# take query t itself out of its class's mass).
IND_ONE, IND_TYPE0, IND_TYPE1 = "one", "type0", "type1"


@dataclasses.dataclass(frozen=True)
class Epilogue:
  """The layout of the epilogue (``epilogue_layout``): ``C`` parts (columns of the kernel's
  partial sums) and the channels (``channels.num_channels`` order) they add up to.

  Fields:
    sel: float32 ``[E_COLS, C]``, which lanes of X (``head_rows`` with the offsets in their
      ``diag_lane``) each part adds, with sign (0, 1 or -1: exact in bfloat16).
    factors: float32 ``[FACTOR_ROWS, C]``, which parts are divided by the row's mass and
      multiplied by its entropy.
    merge: float32 ``[C, c]``, 1 where part p adds to channel c.
    parts: per part ``(channel, indicator)``: its per-query weight is the channel's
      (``channels.channel_weights``) times the indicator (``IND_*``, ``("rel", relations)`` or
      ``("class", token class)``).
  """
  sel: np.ndarray
  factors: np.ndarray
  merge: np.ndarray
  parts: tuple

  @property
  def width(self) -> int:
    return self.sel.shape[1]


@functools.lru_cache(maxsize=None)
def _layout(names: tuple, direction: str, measures: bool) -> Epilogue:
  roles = tile_roles(names)
  parts = []    # (channel, {lane: sign}, divided by the mass, times the entropy, indicator)

  def add(channel, lanes, indicator=IND_ONE, mass=False, entropy=False):
    parts.append((channel, lanes, mass, entropy, indicator))

  relation_roles = [r for r in roles if r.kernel == vocab.KERNEL_RELATION]
  for i, r in enumerate(roles):
    role = functools.partial(add, i, mass=True, entropy=r.entropy_weighted)
    if r.kernel == vocab.KERNEL_OFFSETS:
      lo, hi = r.offsets
      role({diag_lane(o): 1 for o in range(lo, hi + 1)})
    elif r.kernel == vocab.KERNEL_BLOCK:
      role({E_BLOCK0: 1}, IND_TYPE0)
      role({E_BLOCK1: 1}, IND_TYPE1)
    elif r.kernel == vocab.KERNEL_KEYS:
      role({KEY_COLUMNS[frozenset(r.keys)]: 1})
    elif direction == "dep2head":
      role({R_RELATION: 1}, ("rel", tuple(r.relations)))
    else:
      role({R_RELATION + relation_roles.index(r): 1})
  base = len(roles)
  # Guan's distance features: the windows over keys neither special nor t (t itself is in
  # window 0 when it is a window key: taken out), self, then the special keys but t
  for w in range(NUM_WINDOWS):
    add(base + w, {WIN0 + w: 1})
  add(base, {diag_lane(0): -1}, ("class", TOKEN_OTHER))
  add(base + NUM_WINDOWS, {diag_lane(0): 1})
  for j, (lane, cls) in enumerate(((E_CLS, TOKEN_CLS), (E_SEP, TOKEN_SEP), (E_COMMA, TOKEN_COMMA),
                                   (E_PERIOD, TOKEN_PERIOD))):
    add(base + NUM_WINDOWS + 1 + j, {lane: 1})
    add(base + NUM_WINDOWS + 1 + j, {diag_lane(0): -1}, ("class", cls))
  channels = base + NUM_WINDOWS + 5
  if measures:   # entropy, the [CLS] row's entropy, [CLS], [SEP], punctuation, previous, next
    for lanes in ({R_ENTROPY: 1}, {R_ENTROPY: 1}, {E_CLS: 1}, {E_SEP: 1},
                  {E_COMMA: 1, E_PERIOD: 1}, {diag_lane(-1): 1}, {diag_lane(1): 1}):
      add(channels, lanes)
      channels += 1
  width = max(16, 1 << (len(parts) - 1).bit_length())
  sel = np.zeros((E_COLS, width), np.float32)
  factors = np.zeros((FACTOR_ROWS, width), np.float32)
  merge = np.zeros((width, channels), np.float32)
  for p, (channel, lanes, mass, entropy, _) in enumerate(parts):
    for lane, sign in lanes.items():
      sel[lane, p] = sign
    factors[F_MASS, p], factors[F_ENTROPY, p] = mass, entropy
    merge[p, channel] = 1.0
  return Epilogue(sel, factors, merge, tuple((c, ind) for c, _, _, _, ind in parts))


def epilogue_layout(roles: Sequence[str], direction: str, measures: bool) -> Epilogue:
  """The epilogue's parts for these statistics (``Epilogue``; cached, static per program): every
  role one part (``block`` two: its own segment's column by the query's token type), each
  distance feature one, plus one per feature that takes query t itself out, each measure one;
  at most 64 parts for the 13 roles, both directions and the measures (47)."""
  return _layout(tuple(getattr(r, "name", r) for r in roles), direction, bool(measures))


def diagonals_in_place(raw, row):
  """``head_rows``' results ``[T, E_COLS]`` with each row's offsets ``p[t, t + o]`` moved from
  the row's own near columns (``NEAR0 + row + o + BAND``) to the same lanes for every row
  (``diag_lane(o)``): five masked row sums; ``row`` int32 ``[T, 1]``, each row's index in its
  block."""
  lane = jax.lax.broadcasted_iota(jnp.int32, raw.shape, raw.ndim - 1)
  offsets = range(-BAND, BAND + 1)
  diags = [jnp.sum(jnp.where(lane == NEAR0 + row + (o + BAND), raw, 0.0), axis=-1, keepdims=True)
           for o in offsets]
  for o, d in zip(offsets, diags):
    raw = jnp.where(lane == diag_lane(o), d, raw)
  return raw


def _halves(x, contraction: str):
  """``x`` float32 as the contraction's operands: two bfloat16 halves ``hi + lo`` (``"hilo"``),
  or itself (``"float32"``)."""
  if contraction == "hilo":
    hi = x.astype(jnp.bfloat16)
    return hi, (x - hi.astype(jnp.float32)).astype(jnp.bfloat16)
  return (x,)


def _exact_dot(x, exact, contraction: str, dims, exact_left: bool = False):
  """``x`` (float32, split into ``_halves``) contracted with ``exact`` (values exact in
  bfloat16: signs, one-hots) by ``dot_general`` with ``dims`` (``exact`` the left operand with
  ``exact_left``), float32."""
  out = None
  for half in _halves(x, contraction):
    pair = (exact.astype(half.dtype), half) if exact_left else (half, exact.astype(half.dtype))
    part = jax.lax.dot_general(*pair, dims, preferred_element_type=jnp.float32,
                               precision=(jax.lax.Precision.HIGHEST
                                          if half.dtype == jnp.float32 else None))
    out = part if out is None else out + part
  return out


def head_partials(raw, weights, sel, factors, row, slots=None, contraction: str = "hilo"):
  """The epilogue of one head on one query block: every part's weighted sum over the block's
  rows, float32 ``[1, C]``, or per sequence slot ``[S, C]`` (a packed row).

  X = ``diagonals_in_place(raw)``; the parts' values per row ``Y = X @ sel`` (one product, X in
  the contraction's halves); each divided by the row's mass and times its entropy where
  ``factors`` say; times the rows' ``weights`` (the block's rows of ``kernel_tables``' per-part
  weights, shared by all heads); one sum over the rows (with ``slots`` float32 ``[T, S]``, the
  rows' slot one-hot: a product, the parts in halves).

  Args:
    raw: ``head_rows`` ``[T, E_COLS]``; weights ``[T, C]``; sel ``[E_COLS, C]``; factors the
      rows of ``Epilogue.factors``, each ``[1, C]`` (Triton slices no value: loaded row by row);
      row int32 ``[T, 1]``.
  """
  lane = jax.lax.broadcasted_iota(jnp.int32, raw.shape, raw.ndim - 1)
  total = jnp.sum(jnp.where(lane == E_REAL, raw, 0.0), axis=-1, keepdims=True)
  entropy = jnp.sum(jnp.where(lane == R_ENTROPY, raw, 0.0), axis=-1, keepdims=True)
  inv_total = 1.0 / jnp.where(total > 0, total, 1.0)
  y = _exact_dot(diagonals_in_place(raw, row), sel, contraction, (((1,), (0,)), ((), ())))
  f_mass, f_entropy = factors[F_MASS], factors[F_ENTROPY]
  v = y * weights * (1.0 + f_mass * (inv_total - 1.0)) * (1.0 + f_entropy * (entropy - 1.0))
  if slots is None:
    return jnp.sum(v, axis=0, keepdims=True)
  return _exact_dot(v, slots, contraction, (((0,), (0,)), ((), ())), exact_left=True)


def merge_parts(partials, layout: Epilogue):
  """The parts' sums ``[..., C]`` -> the channels' ``[..., c]`` (``Epilogue.merge``)."""
  return jnp.einsum("...p,pc->...c", partials, jnp.asarray(layout.merge),
                    precision=jax.lax.Precision.HIGHEST)


def head_values(q, k, setup: dict, q_info, k_rows, *, roles: tuple, direction: str,
                measures: bool, scale: float, packed: bool = False) -> list:
  """One head's channel values per query row of a block (``tile_values``), with the block's
  ``setup`` (``block_setup``): ``channel_values`` of ``head_rows``."""
  raw = head_rows(q, k, setup, q_info, k_rows, roles=roles, direction=direction, scale=scale,
                  packed=packed)
  row = jax.lax.broadcasted_iota(jnp.int32, (q.shape[0], 1), 0)
  return channel_values(raw, q_info, row, roles=roles, direction=direction, measures=measures)


def tile_values(q, k, q_info, k_rows, k_cols, e_table, n, t0, *, roles: tuple, direction: str,
                measures: bool, scale: float, contraction: str = "hilo",
                packed: bool = False) -> list:
  """Every output channel's value per query row of one tile (module docstring).

  Args:
    q: ``[T, e]`` the block's queries (rows ``t0 .. t0 + T - 1``), any float dtype.
    k: ``[K, e]`` all keys of the sequence (K >= every real position).
    q_info: the rows' query table, a sequence of int32 ``[T, 1]`` indexed by ``Q_*``.
    k_rows: the key table, a sequence of int32 ``[1, K]`` indexed by ``K_*``.
    k_cols: the same as columns, int32 ``[K, 1]`` (for the per-key right-hand sides). The
      tables come as separate vectors because Triton cannot slice a tensor: the kernels load
      each from its ref.
    e_table: float32 ``[K, E_COLS]`` the key-column features (``E_*``; the other columns 0).
    n: int32 scalar, the shortest sequence's real positions among the block's rows (J(n): the
      window corrections; each key's own window by ``K_N``); t0: int32 scalar, the block's
      first row.
    roles: ``tile_roles(...)`` rows; direction: ``"dep2head"`` or ``"both"``; measures: add the
      7 measure channels; scale: the score scale ``1 / sqrt(e)``; contraction: ``"hilo"`` (two
      bfloat16 halves) or ``"float32"``; packed: the rows hold several sequences (``Q_SEG``,
      ``K_SEG``: a query attends its own sequence's keys).

  Returns:
    the channel values, a list of float32 ``[T, 1]`` in the order of
    ``heads_jax.stats.fused.num_channels``: roles, 21 distance features, then with ``measures``
    entropy, entropy (the ``[CLS]`` row's, weighted by the caller), [CLS], [SEP], punctuation,
    previous and next token.
  """
  setup = block_setup(k_rows, k_cols, e_table, n, t0, q.shape[0], contraction)
  return head_values(q, k, setup, q_info, k_rows, roles=roles, direction=direction,
                     measures=measures, scale=scale, packed=packed)
