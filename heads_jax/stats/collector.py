"""Streaming collection of per-sequence statistics on the host (no jax here).

``collect`` drives an analysis step (``heads_jax.stats.step``) over a batch iterator that
yields ``(indices, batch)``: ``indices`` int ``[b]`` are the positions of the batch's
sequences in the dataset, ``batch`` an encoded batch. Results go into arrays preallocated
for the whole dataset (``[N, l, h, r]``, ``[N, l, h, 21]``, ``[N]``) in the dataset's order,
so memory does not grow with the number of batches. A packed batch (a ``segment_ids`` field,
``heads_jax.data.encoding.pack_batches``) comes with ``indices`` of its ``b * S`` slots (row
``i * S + j``: the sequence in slot j of row i, -1 for an empty slot), and the step returns its
results per slot. While the device works on one batch the
host prepares the next one (one batch in flight).

When the step also returns the measures of ``heads_jax.stats.measures`` (``entropy``,
``cls_entropy`` ``[b, l, h]``, ``token_attention`` ``[b, l, h, 5]``), they are gathered the
same way (``[N, ...]``); the Jensen-Shannon distances ``js`` ``[b, l*h, l*h]`` are summed over
the sequences instead (``[N, l*h, l*h]`` would be large) and come back as their mean.
``combine_measures`` joins the measures of several data sets. ``fields(batch, slots)`` (optional)
adds host-side per-sequence arrays computed from the encoded batch itself (the device pass's
special-token share and windowed baselines, ``heads_jax.pipelines.device_pass.sequence_fields``),
gathered the same way.

The collector returns arrays; the analysis job writes them with ``heads_jax.contract``
(``write_scores``, ``write_measures``), the one owner of the files of DESIGN.md section 4.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from heads_jax.contract import MEASURE_ROW_KEYS

# Per-sequence arrays some models' steps add: DeBERTa's term_shares [b, l, h, 3]
# (heads_jax.model.deberta), kept and combined like the measures.
OPTIONAL_ROW_KEYS = ("term_shares",)


def batch_slots(batch: dict, indices) -> int:
  """A packed batch's sequences per row S (``len(indices) / rows``); 0 for an unpacked batch."""
  if batch.get("segment_ids") is None:
    return 0
  rows = len(np.asarray(batch["attention_mask"]))
  if rows == 0 or len(indices) % rows:
    raise ValueError(f"a packed batch of {rows} rows needs indices for rows x slots sequences, got "
                     f"{len(indices)}")
  return len(indices) // rows


def _real_lengths(batch: dict, slots: int = 0) -> np.ndarray:
  """Real positions of each sequence, int32 ``[b]`` (a packed batch: ``[b * slots]``)."""
  if not slots:
    return np.asarray(batch["attention_mask"]).astype(bool).sum(-1).astype(np.int32)
  seg = np.asarray(batch["segment_ids"])
  real = np.asarray(batch["attention_mask"]).astype(bool)
  counts = [((seg == j + 1) & real).sum(-1) for j in range(slots)]
  return np.stack(counts, axis=1).reshape(-1).astype(np.int32)


class _Sink:
  """Preallocated result arrays, filled row by row in dataset order."""

  def __init__(self, num_sequences: int):
    self.n = num_sequences
    self.arrays = None
    self.filled = np.zeros(num_sequences, bool)
    self.seen = np.zeros(num_sequences, bool)  # submitted (maybe not yet fetched)
    self.lengths = np.zeros(num_sequences, np.int32)
    self.fields = {}                                  # name -> [N, ...] (the ``fields`` hook)
    self.js_sum, self.js_count = None, 0

  def put_fields(self, indices: np.ndarray, keep: np.ndarray, fields: dict):
    """Stores the rows ``keep`` of host-side per-sequence arrays ``{name: [b, ...]}``."""
    for name, x in fields.items():
      x = np.asarray(x)
      if x.shape[0] != len(indices):
        raise ValueError(f"fields returned {name} of {x.shape[0]} rows for a batch of "
                         f"{len(indices)} sequences")
      if name not in self.fields:
        self.fields[name] = np.full((self.n,) + x.shape[1:], np.nan, np.float32)
      self.fields[name][indices[keep]] = x[keep]

  def put(self, indices: np.ndarray, keep: np.ndarray, lengths: np.ndarray, out: dict):
    """Stores the rows ``keep`` of a batch's results at ``indices[keep]``."""
    missing = [name for name in ("sieve_bias", "distance") if name not in out]
    if missing:
      raise KeyError(f"the step's result lacks {missing}; an analysis step returns sieve_bias "
                     "and distance (heads_jax.stats.step)")
    rows = {name: np.asarray(out[name]) for name in ("sieve_bias", "distance") + MEASURE_ROW_KEYS
            + OPTIONAL_ROW_KEYS if name in out}
    if self.arrays is None:
      self.arrays = {name: np.full((self.n,) + x.shape[1:], np.nan, np.float32)
                     for name, x in rows.items()}
    if set(rows) != set(self.arrays):
      raise ValueError(f"the step returned {sorted(rows)} for one batch and {sorted(self.arrays)} "
                       "for another")
    if "js" in out:
      js = np.asarray(out["js"], np.float64)[keep].sum(0)
      self.js_sum = js if self.js_sum is None else self.js_sum + js
      self.js_count += int(keep.sum())
    for name, x in rows.items():
      if x.shape[0] != len(indices) or x.shape[1:] != self.arrays[name].shape[1:]:
        raise ValueError(f"step returned {name} of shape {x.shape} for a batch of "
                         f"{len(indices)} sequences; expected {(len(indices),) + self.arrays[name].shape[1:]}")
      self.arrays[name][indices[keep]] = x[keep]
    self.lengths[indices[keep]] = lengths[keep]
    self.filled[indices[keep]] = True


def _check_indices(indices, batch: dict, num_sequences: int, seen: np.ndarray) -> np.ndarray:
  """Validates a batch's indices and marks them in ``seen``; returns bool ``[b]``, True for
  real rows (index -1 marks a filler row, as ``heads_jax.data.encoding.iter_batches`` yields
  with ``pad_to_batch_size``)."""
  indices = np.asarray(indices)
  rows = len(np.asarray(batch["attention_mask"])) * max(batch_slots(batch, indices), 1)
  if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
    raise ValueError(f"indices must be a 1-d integer array, got {indices.dtype} {indices.shape}")
  if len(indices) != rows:
    raise ValueError(f"got {len(indices)} indices for a batch of {rows} sequences; the batch "
                     "iterator must yield (indices [b], batch with b rows)")
  keep = indices != -1
  real = indices[keep]
  if len(real) and (real.min() < 0 or real.max() >= num_sequences):
    raise ValueError(f"indices must lie in [0, {num_sequences}) (or be -1 for filler rows), got "
                     f"min {real.min()} max {real.max()}; is num_sequences the dataset size?")
  if len(np.unique(real)) != len(real) or seen[real].any():
    raise ValueError("a sequence index came twice from the batch iterator; each sequence of the "
                     "dataset must appear in exactly one batch")
  seen[real] = True
  return keep


def collect(step, batches: Iterable, num_sequences: int, *, roles: Sequence[str] | None = None,
            progress: bool = True, desc: str = "analysis", allow_missing: bool = False,
            fields=None) -> dict:
  """Runs ``step`` over every batch and gathers the per-sequence statistics.

  Args:
    step: an ``AnalysisStep`` (uses ``step.submit`` to keep one batch in flight) or any
      callable ``step(batch) -> {"sieve_bias": [b, l, h, r], "distance": [b, l, h, 21]}``.
    batches: iterable of ``(indices int [b], batch)``, e.g.
      ``heads_jax.data.encoding.iter_batches``; index -1 marks a filler row (skipped).
    num_sequences: N, the dataset size (indices lie in ``0..N-1``).
    roles: role names of the r axis (default: ``step.roles``).
    progress: show a tqdm bar (sequences/s and ETA).
    allow_missing: if False (default) every index ``0..N-1`` must have come; otherwise rows
      that never came stay NaN with length 0.
    fields: ``fields(batch, slots) -> {name: float [b * max(slots, 1), ...]}``, host-side
      per-sequence arrays of each batch (module docstring), returned as float32 ``[N, ...]``.

  Returns:
    dict: ``sieve_bias`` float32 ``[N, l, h, r]``, ``distance`` float32 ``[N, l, h, 21]``,
    ``lengths`` int32 ``[N]``, ``roles`` tuple of str; and, when the step returns measures,
    ``entropy``, ``cls_entropy`` ``[N, l, h]``, ``token_attention`` ``[N, l, h, 5]``, and ``js``
    float32 ``[l*h, l*h]`` (mean over the sequences) with ``js_sequences`` (their number);
    ``term_shares`` ``[N, l, h, 3]`` when the step returns them (DeBERTa).
  """
  if num_sequences < 1:
    raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
  if roles is None:
    roles = getattr(step, "roles", None)
    if roles is None:
      raise ValueError("pass roles=... (the step has no .roles attribute)")
  roles = tuple(roles)
  sink = _Sink(num_sequences)
  submit = getattr(step, "submit", None)
  pending = None  # (indices, lengths, PendingResult) of the batch on the device
  with tqdm(total=num_sequences, unit="seq", desc=desc, disable=not progress,
            dynamic_ncols=True, smoothing=0.1) as bar:
    for indices, batch in batches:
      keep = _check_indices(indices, batch, num_sequences, sink.seen)
      if not keep.any():
        continue
      indices = np.asarray(indices)
      slots = batch_slots(batch, indices)
      lengths = _real_lengths(batch, slots)
      if fields is not None:
        sink.put_fields(indices, keep, fields(batch, slots))
      if submit is None:
        sink.put(indices, keep, lengths, step(batch))
        bar.update(int(keep.sum()))
        continue
      handle = submit(batch, slots=slots) if slots else submit(batch)
      if pending is not None:
        sink.put(*pending[:3], pending[3].result())
        bar.update(int(pending[1].sum()))
      pending = (indices, keep, lengths, handle)
    if pending is not None:
      sink.put(*pending[:3], pending[3].result())
      bar.update(int(pending[1].sum()))
  if sink.arrays is None:
    raise ValueError("the batch iterator yielded no batch")
  missing = np.flatnonzero(~sink.filled)
  if len(missing) and not allow_missing:
    raise ValueError(f"{len(missing)} of {num_sequences} sequences never came from the batch "
                     f"iterator (first: {missing[:5].tolist()}); pass allow_missing=True to "
                     "keep them as NaN")
  if sink.arrays["sieve_bias"].shape[-1] != len(roles):
    raise ValueError(f"the step returned {sink.arrays['sieve_bias'].shape[-1]} roles but roles "
                     f"names {len(roles)}: {list(roles)}")
  result = {**sink.arrays, **sink.fields, "lengths": sink.lengths, "roles": roles}
  if sink.js_sum is not None:
    result["js"] = (sink.js_sum / max(sink.js_count, 1)).astype(np.float32)
    result["js_sequences"] = sink.js_count
  return result


def combine_measures(parts) -> dict:
  """The measures of several ``collect`` results (e.g. one per data spec) as one: per-sequence
  arrays concatenated along N (with ``lengths`` and any ``data_index``), ``js`` averaged with
  the weights ``js_sequences``. Returns a dict for ``heads_jax.contract.write_measures``."""
  parts = [p for p in parts if p is not None]
  if not parts or any(k not in p for p in parts for k in MEASURE_ROW_KEYS):
    raise KeyError("every part needs entropy, cls_entropy and token_attention: make the analysis "
                   "step with measures=True")
  keys = MEASURE_ROW_KEYS + ("lengths",) + (("data_index",) if all("data_index" in p for p in parts) else ())
  keys += tuple(k for k in OPTIONAL_ROW_KEYS if all(k in p for p in parts))
  out = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in keys}
  with_js = [p for p in parts if p.get("js") is not None]
  if with_js:
    weights = np.asarray([p.get("js_sequences", len(p["lengths"])) for p in with_js], np.float64)
    js = sum(w * np.asarray(p["js"], np.float64) for w, p in zip(weights, with_js))
    out["js"] = (js / max(weights.sum(), 1.0)).astype(np.float32)
    out["js_sequences"] = int(weights.sum())
  return out
