"""Activation patching per head, and its first-order approximation (attribution patching).

For clean/corrupted pairs of the same positions (`heads_jax.ablation.corrupt` builds them),
each head's output (its context vector ``ctx_h = sum_k a[q, k] v_k``, ``[b, q, e]``, before the
output projection: `heads_jax.model.attention.AttentionHooks.edit_context`) is taken from the
corrupted run and written into the clean run, one head at a time, and the change of the logit
difference is measured (as TransformerLens's and nnsight's head patching do for decoders):

* the metric ``LD`` of a row: for a classifier, the logit of the class the clean run predicts
  minus the logit of its runner-up class (the other class of a binary task); for a span model,
  the start logit plus the end logit of the clean run's most likely span;
* the effect of head ``(l, h)``: ``(mean LD_patched - mean LD_clean) / (mean LD_corrupted -
  mean LD_clean)`` over the rows: 0 when the head's corrupted output changes nothing, 1 when it
  moves the prediction as far as the whole corruption does;
* all heads of a layer in one program: the clean run is repeated for every head by ``vmap``
  over a one-hot head index (``[h, b]`` rows), the layer a traced argument (one compilation);
* attribution patching: ``(ctx_corrupted - ctx_clean) . dLD/dctx`` at the clean run, summed
  over the head's positions and features, for every head of every layer from one backward
  pass (a zero perturbation of every layer's context is the gradient's variable); the same
  normalisation.

Intervals: percentile bootstrap over rows (the ratio of means re-drawn), ``BOOTSTRAP`` draws.

Shapes: b batch, l layer, h head, q query, e head dimension, n rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sps

from heads_jax.ablation.attribution import Apply, predicted
from heads_jax.errors import UserError

BOOTSTRAP = 1000


def contrast(outputs: dict, mask) -> jax.Array:
  """int ``[b, 2]``: the clean run's (predicted, runner-up) classes of a classifier, or its
  (start, end) span of a span model (`predicted`): what the logit difference compares."""
  if "logits" in outputs:
    order = jnp.argsort(-outputs["logits"], -1)
    return order[:, :2].astype(jnp.int32)
  return predicted(outputs, mask)


def logit_difference(outputs: dict, pair) -> jax.Array:
  """float32 ``[b]``: ``LD`` of each row (module docstring) for the fixed ``pair``
  (`contrast`)."""
  if "logits" in outputs:
    z = outputs["logits"].astype(jnp.float32)
    take = lambda i: jnp.take_along_axis(z, pair[:, i:i + 1], -1)[:, 0]  # noqa: E731
    return take(0) - take(1)
  start = jnp.take_along_axis(outputs["start_logits"], pair[:, :1], -1)[:, 0]
  end = jnp.take_along_axis(outputs["end_logits"], pair[:, 1:], -1)[:, 0]
  return (start + end).astype(jnp.float32)


def recorded(apply: Apply, params, batch: dict, edit_context=None):
  """``(outputs, ctx)``: the model's outputs and every layer's head outputs ``[l, b, q, h,
  e]`` as they leave the attention (after ``edit_context``, when given)."""
  seen = {}

  def edit(l, ctx):
    if edit_context is not None:
      ctx = edit_context(l, ctx)
    seen[l] = ctx
    return ctx

  out = apply(params, batch, edit_context=edit)
  return out, jnp.stack([seen[l] for l in sorted(seen)])


def patched_layer(apply: Apply, params, clean: dict, corrupted_ctx, layer, pair) -> jax.Array:
  """float32 ``[h, b]``: ``LD`` of the clean run with head ``h`` of layer ``layer`` (traced)
  given its output from the corrupted run, ``corrupted_ctx`` ``[b, q, h, e]``, for every
  ``h`` (one ``vmap``)."""
  num_heads = corrupted_ctx.shape[2]

  def one(h):
    pick = (jnp.arange(num_heads) == h)[None, None, :, None]

    def edit(l, ctx):
      return jnp.where((l == layer) & pick, corrupted_ctx.astype(ctx.dtype), ctx)
    return logit_difference(apply(params, clean, edit_context=edit), pair)

  return jax.vmap(one)(jnp.arange(num_heads))


def attribution_patching(apply: Apply, params, clean: dict, corrupted_ctx, pair):
  """``(estimate [l, b, h], ld_clean [b])``: ``(ctx_corrupted - ctx_clean) . dLD/dctx`` of
  every head from one backward pass at the clean run (module docstring); ``corrupted_ctx``
  ``[l, b, q, h, e]``."""

  def f(delta):
    out, ctx = recorded(apply, params, clean, lambda l, c: c + delta[l].astype(c.dtype))
    ld = logit_difference(out, pair)
    return jnp.sum(ld), (ld, ctx)

  zero = jnp.zeros(corrupted_ctx.shape, jnp.float32)
  grad, (ld, ctx) = jax.grad(f, has_aux=True)(zero)
  diff = corrupted_ctx.astype(jnp.float32) - ctx.astype(jnp.float32)
  return jnp.einsum("lbqhe,lbqhe->lbh", diff, grad), ld


@dataclasses.dataclass
class Patching:
  """Patching over a data set.

  ``patched`` float32 ``[n, l, h]``: ``LD_patched - LD_clean`` of each row and head;
  ``estimated`` ``[n, l, h]``: attribution patching's estimate of the same; ``clean``,
  ``corrupted`` ``[n]``: ``LD`` of the clean and the corrupted run; ``pair`` ``[n, 2]``."""
  patched: np.ndarray
  estimated: np.ndarray
  clean: np.ndarray
  corrupted: np.ndarray
  pair: np.ndarray

  @property
  def denominator(self) -> float:
    return float(np.mean(self.corrupted - self.clean))

  def effect(self, which: str = "patched") -> np.ndarray:
    """float ``[l, h]``: the normalised effect of each head (module docstring)."""
    return np.mean(getattr(self, which), 0) / self.denominator

  def interval(self, which: str = "patched", *, draws: int = BOOTSTRAP, seed: int = 0,
               level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` ``[l, h]``: the percentile bootstrap interval of `effect` over rows."""
    values, gap = getattr(self, which), self.corrupted - self.clean
    rng = np.random.default_rng(seed)
    n = len(gap)
    idx = rng.integers(0, n, size=(draws, n))
    boot = values[idx].mean(1) / gap[idx].mean(1)[:, None, None]         # [draws, l, h]
    a = (1 - level) / 2
    return np.quantile(boot, a, axis=0), np.quantile(boot, 1 - a, axis=0)

  def correlation(self) -> dict:
    """Pearson and Spearman correlation of the two methods' effects over the heads."""
    x, y = self.effect("patched").ravel(), self.effect("estimated").ravel()
    if np.std(x) == 0 or np.std(y) == 0:
      return {"pearson": float("nan"), "spearman": float("nan")}
    return {"pearson": float(np.corrcoef(x, y)[0, 1]),
            "spearman": float(sps.spearmanr(x, y).statistic)}


class Patcher:
  """Jitted patching programs of one model: `runs` (the clean run's pair and LD, the corrupted
  run's LD and head outputs, attribution patching) and `layer` (every head of one layer
  patched, the layer traced)."""

  def __init__(self, apply: Apply, params):
    self.params = params

    def runs(params, clean, corrupted):
      out = apply(params, clean)
      pair = contrast(out, clean["attention_mask"])
      corr_out, corr_ctx = recorded(apply, params, corrupted)
      estimate, ld = attribution_patching(apply, params, clean, corr_ctx, pair)
      return pair, ld, logit_difference(corr_out, pair), corr_ctx, estimate

    self._runs = jax.jit(runs)
    self._layer = jax.jit(lambda params, clean, ctx, layer, pair: patched_layer(
        apply, params, clean, ctx, layer, pair))

  def batch(self, clean: dict, corrupted: dict) -> dict:
    pair, ld, ld_corr, corr_ctx, estimate = self._runs(self.params, clean, corrupted)
    patched = [np.asarray(self._layer(self.params, clean, corr_ctx[l], jnp.int32(l), pair))
               for l in range(corr_ctx.shape[0])]                         # each [h, b]
    ld = np.asarray(ld)
    return {"patched": np.stack(patched, 0).transpose(2, 0, 1) - ld[:, None, None],
            "estimated": np.asarray(estimate).transpose(1, 0, 2), "clean": ld,
            "corrupted": np.asarray(ld_corr), "pair": np.asarray(pair)}


def check_pairs(clean: dict, corrupted: dict) -> None:
  """UserError (one line) unless the corrupted set has the clean set's rows and, row by row,
  its positions (patching writes position q of one run into position q of the other)."""
  n, m = len(clean["input_ids"]), len(corrupted["input_ids"])
  if n != m:
    raise UserError(f"the corrupted set has {m} rows, the clean set {n}: give one corrupted row "
                    "per clean row, in the same order")
  a = np.asarray(clean["attention_mask"]).sum(-1)
  b = np.asarray(corrupted["attention_mask"]).sum(-1)
  bad = np.flatnonzero(a != b)
  if len(bad):
    i = int(bad[0])
    raise UserError(f"row {i}: the corrupted text has {int(b[i])} tokens, the clean {int(a[i])} "
                    f"({len(bad)} rows differ); patching needs the same positions in both: give "
                    "corrupted rows of the same token length")


def patch(apply: Apply, params, batches, corrupted: dict, *, progress=None) -> Patching:
  """`Patching` of every row of ``batches`` (``[(clean batch dict, rows [b])]``, rows -1 for
  filler rows) against ``corrupted`` (``input_ids``, ``attention_mask``, ``token_type_ids``
  ``[n, k]`` by row, the same positions: `check_pairs`)."""
  patcher = Patcher(apply, params)
  parts = []
  for i, (batch, rows) in enumerate(batches):
    rows = np.asarray(rows)
    width = batch["input_ids"].shape[1]
    take = np.where(rows >= 0, rows, 0)
    corr = {k: np.where((rows >= 0)[:, None], np.asarray(corrupted[k])[take, :width],
                        np.asarray(batch[k])) for k in ("input_ids", "attention_mask",
                                                        "token_type_ids")}
    clean = {k: jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    r = patcher.batch(clean, {k: jnp.asarray(v) for k, v in corr.items()})
    keep = rows >= 0
    parts.append((rows[keep], {k: v[keep] for k, v in r.items()}))
    if progress is not None:
      progress(i + 1, len(batches))
  order = np.argsort(np.concatenate([rows for rows, _ in parts]))
  cat = {k: np.concatenate([p[k] for _, p in parts])[order] for k in parts[0][1]}
  return Patching(**cat)
