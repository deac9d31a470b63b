"""The survey's other per-head measures, reduced on the device (jnp, jit-friendly).

Conventions as ``heads_jax.stats.sieve_bias`` and ``heads_jax.stats.distance``: inputs are the
attention ``[b, l, h, q, k]`` of a batch (padding keys 0, padding query rows 0), its
``attention_mask`` ``[b, k]`` and ``token_class`` ``[b, k]`` (``heads_jax.data.vocabulary.TOKEN_*``);
outputs are per sequence. A sequence without real positions (an all-padding filler row) gives
0 everywhere.

* ``attention_entropy`` ``[b, l, h]``: the natural-log entropy of each real query's attention
  row (normalised over the real keys, as ``scipy.stats.entropy``), averaged over the real
  queries (Clark et al. 2019, sec. 3.3, Fig. 4); ``cls_entropy`` ``[b, l, h]``: the entropy of the
  ``[CLS]`` query's row alone (their Fig. 4, bottom).
* ``token_attention`` ``[b, l, h, 5]`` in the order of ``TOKEN_MEASURES``: the attention mass a
  real query puts on ``[CLS]``, on ``[SEP]`` positions and on punctuation (``,`` and ``.``),
  averaged over all real queries; and the mass on the previous (next) token, averaged over the
  real queries that have one (positions 1..n-1, resp. 0..n-2) (Clark et al. Figs. 1-2).
* ``js_distances`` ``[b, l*h, l*h]``: the Jensen-Shannon distance (``sqrt`` of the divergence,
  natural log, as ``scipy.spatial.distance.jensenshannon``) between the attention rows of every
  pair of heads, averaged over the real query rows (Clark et al. sec. 6, Fig. 6). Heads are
  numbered ``l * H + h``. Cost: ``(l h)^2 q k`` logarithms per sequence, so it is an option.
* ``attention_cosine`` ``[b, l, h]``: cosine similarity of each head's flattened real ``[q, k]``
  map under two models on the same input (Kovaleva et al. 2019, Fig. 5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_COMMA, TOKEN_PERIOD, TOKEN_SEP
# The contract of measures.npz (heads_jax.contract): the token_attention columns and the
# per-sequence arrays `all_measures` returns besides `js`.
from heads_jax.contract import MEASURE_ROW_KEYS as MEASURE_KEYS
from heads_jax.contract import TOKEN_MEASURES
from heads_jax.sieves import real_pairs
from heads_jax.stats.sieve_bias import normalised_rows, row_entropy

_HIGHEST = jax.lax.Precision.HIGHEST


def _check(attn, attention_mask, token_class=None):
  attn = jnp.asarray(attn).astype(jnp.float32)
  attention_mask = jnp.asarray(attention_mask)
  if attn.ndim != 5:
    raise ValueError(f"attn must be [b, l, h, q, k], got shape {attn.shape}")
  b, _, _, q, k = attn.shape
  if q != k or attention_mask.shape != (b, k):
    raise ValueError(f"attn {attn.shape} needs q == k and attention_mask of shape {(b, k)}; got "
                     f"{attention_mask.shape}")
  if token_class is not None:
    token_class = jnp.asarray(token_class)
    if token_class.shape != (b, k):
      raise ValueError(f"token_class must be [b, k] = {(b, k)}, got {token_class.shape}")
  return attn, attention_mask, token_class


def attention_entropy(attn, attention_mask) -> jnp.ndarray:
  """Mean row entropy over the real queries, float32 ``[b, l, h]``."""
  attn, attention_mask, _ = _check(attn, attention_mask)
  real = (attention_mask > 0).astype(jnp.float32)                       # [b, q]
  n = jnp.maximum(jnp.sum(real, axis=-1), 1.0)
  ent = row_entropy(attn, attention_mask)                               # [b, l, h, q]
  return jnp.einsum("blhq,bq->blh", ent, real, precision=_HIGHEST) / n[:, None, None]


def cls_entropy(attn, attention_mask) -> jnp.ndarray:
  """Entropy of the ``[CLS]`` (position 0) query's row, float32 ``[b, l, h]`` (0 for an
  all-padding row)."""
  attn, attention_mask, _ = _check(attn, attention_mask)
  ent = row_entropy(attn[:, :, :, :1], attention_mask)[..., 0]          # [b, l, h]
  return jnp.where((attention_mask[:, :1] > 0)[:, :, None], ent, 0.0)


def _token_weights(token_class, attention_mask, segment_ids=None) -> jnp.ndarray:
  """float32 ``[b, q, k, 5]``: the weight of ``attn[q, k]`` in each of ``TOKEN_MEASURES`` (with
  ``segment_ids``, a packed row: each query's own sequence's pairs and length)."""
  q = attention_mask.shape[1]
  pos = jnp.arange(q)
  pair = real_pairs(attention_mask, segment_ids)                         # [b, q, k]
  n = jnp.sum(pair, axis=-1).astype(jnp.float32)[:, :, None]             # [b, q, 1]
  key_is = lambda *classes: jnp.isin(token_class, jnp.asarray(classes))[:, None, :]
  over_n = 1.0 / jnp.maximum(n, 1.0)
  over_n1 = 1.0 / jnp.maximum(n - 1.0, 1.0)
  prev = (pos[None, :] == pos[:, None] - 1)[None]                        # key = query - 1
  nxt = (pos[None, :] == pos[:, None] + 1)[None]                         # key = query + 1
  w = [
      (pair & key_is(TOKEN_CLS)) * over_n,
      (pair & key_is(TOKEN_SEP)) * over_n,
      (pair & key_is(TOKEN_COMMA, TOKEN_PERIOD)) * over_n,
      (pair & prev) * over_n1,
      (pair & nxt) * over_n1,
  ]
  return jnp.stack([x.astype(jnp.float32) for x in w], axis=-1)


def token_attention(attn, token_class, attention_mask) -> jnp.ndarray:
  """Mean attention to ``[CLS]``, ``[SEP]``, punctuation, the previous and the next token,
  float32 ``[b, l, h, 5]`` (order ``TOKEN_MEASURES``; see the module docstring)."""
  attn, attention_mask, token_class = _check(attn, attention_mask, token_class)
  b, l, h, q, k = attn.shape
  w = _token_weights(token_class, attention_mask).reshape(b, q * k, len(TOKEN_MEASURES))
  out = jnp.matmul(attn.reshape(b, l * h, q * k), w, precision=_HIGHEST)
  return out.reshape(b, l, h, len(TOKEN_MEASURES))


def js_distances(attn, attention_mask) -> jnp.ndarray:
  """Jensen-Shannon distance between every pair of heads, float32 ``[b, l*h, l*h]``.

  For heads i, j and a real query t with rows p = p_i[t], r = p_j[t] (normalised over the real
  keys) and m = (p + r) / 2: ``JS(p, r) = sqrt(0.5 sum_s p_s ln(p_s / m_s) + 0.5 sum_s r_s
  ln(r_s / m_s))``; the value of a sequence is the mean over its real queries. Computed one head
  i at a time (``lax.scan``), so the largest intermediate is ``[b, l*h, q, k]``. The matrix is
  exactly symmetric with an exactly zero diagonal.
  """
  attn, attention_mask, _ = _check(attn, attention_mask)
  b, l, h, q, k = attn.shape
  heads = l * h
  p = normalised_rows(attn, attention_mask).reshape(b, heads, q, k)
  tiny = jnp.finfo(jnp.float32).tiny
  log_p = jnp.log(jnp.maximum(p, tiny))
  realf = (attention_mask > 0).astype(jnp.float32)
  n = jnp.maximum(jnp.sum(realf, axis=-1), 1.0)                         # [b]

  def one_head(_, i):
    pi = jax.lax.dynamic_index_in_dim(p, i, axis=1, keepdims=True)       # [b, 1, q, k]
    log_pi = jax.lax.dynamic_index_in_dim(log_p, i, axis=1, keepdims=True)
    m = (pi + p) * 0.5                                                   # [b, P, q, k]
    log_m = jnp.log(jnp.maximum(m, tiny))
    terms = (jnp.where(pi > 0, pi * (log_pi - log_m), 0.0)
             + jnp.where(p > 0, p * (log_p - log_m), 0.0))
    div = 0.5 * jnp.sum(terms, axis=-1)                                  # [b, P, q]
    dist = jnp.sqrt(jnp.maximum(div, 0.0))
    return None, jnp.einsum("bpq,bq->bp", dist, realf, precision=_HIGHEST) / n[:, None]

  _, rows = jax.lax.scan(one_head, None, jnp.arange(heads))              # [P, b, P]
  return jnp.transpose(rows, (1, 0, 2))


def attention_cosine(attn_a, attn_b, attention_mask) -> jnp.ndarray:
  """Cosine similarity of each head's real ``[q, k]`` attention map under two models,
  float32 ``[b, l, h]`` (0 where a map is all zero, e.g. a filler row)."""
  attn_a, attention_mask, _ = _check(attn_a, attention_mask)
  attn_b, _, _ = _check(attn_b, attention_mask)
  if attn_a.shape != attn_b.shape:
    raise ValueError(f"the two attention tensors differ in shape: {attn_a.shape} vs {attn_b.shape}")
  real = attention_mask > 0
  pair = (real[:, :, None] & real[:, None, :])[:, None, None]           # [b, 1, 1, q, k]
  a = jnp.where(pair, attn_a, 0.0)
  c = jnp.where(pair, attn_b, 0.0)
  dot = jnp.sum(a * c, axis=(-2, -1))
  norm = jnp.sqrt(jnp.sum(a * a, axis=(-2, -1)) * jnp.sum(c * c, axis=(-2, -1)))
  return jnp.where(norm > 0, dot / jnp.where(norm > 0, norm, 1.0), 0.0)


def all_measures(attn, token_class, attention_mask, js: bool = False) -> dict:
  """Every per-sequence measure of a batch: ``entropy`` and ``cls_entropy`` ``[b, l, h]``,
  ``token_attention`` ``[b, l, h, 5]``, and with ``js`` the ``js`` distances ``[b, lh, lh]``."""
  out = {"entropy": attention_entropy(attn, attention_mask),
         "cls_entropy": cls_entropy(attn, attention_mask),
         "token_attention": token_attention(attn, token_class, attention_mask)}
  if js:
    out["js"] = js_distances(attn, attention_mask)
  return out
