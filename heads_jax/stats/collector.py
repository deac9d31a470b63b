"""Streaming collection of per-sequence statistics, and ``scores.npz`` (DESIGN.md section 4).

``collect`` drives an analysis step (``heads_jax.stats.step``) over a batch iterator that
yields ``(indices, batch)``: ``indices`` int ``[b]`` are the positions of the batch's
sequences in the dataset, ``batch`` an encoded batch. Results go into arrays preallocated
for the whole dataset (``[N, l, h, r]``, ``[N, l, h, 21]``, ``[N]``) in the dataset's order,
so memory does not grow with the number of batches. While the device works on one batch the
host prepares the next one (one batch in flight).

This module imports no jax: ``load_scores`` / ``save_scores`` are used by the host stages.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

NUM_DISTANCE_FEATURES = 21
SCORE_KEYS = ("sieve_bias", "roles", "distance", "lengths")


def _real_lengths(batch: dict) -> np.ndarray:
  return np.asarray(batch["attention_mask"]).astype(bool).sum(-1).astype(np.int32)


class _Sink:
  """Preallocated result arrays, filled row by row in dataset order."""

  def __init__(self, num_sequences: int):
    self.n = num_sequences
    self.arrays = None
    self.filled = np.zeros(num_sequences, bool)
    self.seen = np.zeros(num_sequences, bool)  # submitted (maybe not yet fetched)
    self.lengths = np.zeros(num_sequences, np.int32)

  def put(self, indices: np.ndarray, keep: np.ndarray, lengths: np.ndarray, out: dict):
    """Stores the rows ``keep`` of a batch's results at ``indices[keep]``."""
    sb, dist = np.asarray(out["sieve_bias"]), np.asarray(out["distance"])
    if self.arrays is None:
      self.arrays = {
          "sieve_bias": np.full((self.n,) + sb.shape[1:], np.nan, np.float32),
          "distance": np.full((self.n,) + dist.shape[1:], np.nan, np.float32),
      }
    for name, x in (("sieve_bias", sb), ("distance", dist)):
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
  rows = len(np.asarray(batch["attention_mask"]))
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
            progress: bool = True, desc: str = "analysis", allow_missing: bool = False) -> dict:
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

  Returns:
    dict: ``sieve_bias`` float32 ``[N, l, h, r]``, ``distance`` float32 ``[N, l, h, 21]``,
    ``lengths`` int32 ``[N]``, ``roles`` tuple of str.
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
      lengths = _real_lengths(batch)
      if submit is None:
        sink.put(indices, keep, lengths, step(batch))
        bar.update(int(keep.sum()))
        continue
      handle = submit(batch)
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
  return {**sink.arrays, "lengths": sink.lengths, "roles": roles}


def _validate(sieve_bias, distance, lengths, roles) -> None:
  if sieve_bias.ndim != 4:
    raise ValueError(f"sieve_bias must be [N, L, H, R], got shape {sieve_bias.shape}")
  n, l, h, r = sieve_bias.shape
  if r != len(roles):
    raise ValueError(f"sieve_bias has {r} roles but {len(roles)} role names were given: {list(roles)}")
  if distance.shape != (n, l, h, NUM_DISTANCE_FEATURES):
    raise ValueError(f"distance must be [N, L, H, 21] = {(n, l, h, NUM_DISTANCE_FEATURES)}, "
                     f"got {distance.shape}")
  if lengths.shape != (n,):
    raise ValueError(f"lengths must be [N] = ({n},), got {lengths.shape}")


def save_scores(path, result: dict, roles: Sequence[str] | None = None) -> Path:
  """Writes ``scores.npz`` (DESIGN.md section 4) to ``path`` exactly (no suffix added).

  Keys: ``sieve_bias`` float32 ``[N, L, H, R]`` (NaN where a role's sieve is empty),
  ``roles`` str ``[R]``, ``distance`` float32 ``[N, L, H, 21]``, ``lengths`` int32 ``[N]``.
  ``roles`` defaults to ``result["roles"]``.
  """
  if roles is None:
    if "roles" not in result:
      raise ValueError("pass roles=... (result has no 'roles')")
    roles = result["roles"]
  roles = tuple(str(r) for r in roles)
  for key in ("sieve_bias", "distance", "lengths"):
    if key not in result:
      raise KeyError(f"result lacks {key!r}; pass the dict returned by collect()")
  sieve = np.asarray(result["sieve_bias"], np.float32)
  distance = np.asarray(result["distance"], np.float32)
  lengths = np.asarray(result["lengths"])
  if not np.issubdtype(lengths.dtype, np.integer):
    raise TypeError(f"lengths must be integer, got {lengths.dtype}")
  _validate(sieve, distance, lengths, roles)
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    np.savez(f, sieve_bias=sieve, roles=np.asarray(roles, dtype=str), distance=distance,
             lengths=lengths.astype(np.int32))
  os.replace(tmp, path)
  return path


def load_scores(path) -> dict:
  """Reads a ``scores.npz``: ``sieve_bias``, ``distance``, ``lengths`` arrays and ``roles``
  (tuple of str), checked for the shapes of DESIGN.md section 4. Additional arrays a writer
  added (e.g. ``data_index``) are returned as they are."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"no scores file at {path}; run the analysis first (analyze/heads)")
  with np.load(path, allow_pickle=False) as data:
    missing = [k for k in SCORE_KEYS if k not in data.files]
    if missing:
      raise ValueError(f"{path} is not a scores.npz: it lacks {missing} (has {data.files})")
    out = {k: data[k] for k in data.files}
  out["roles"] = tuple(str(r) for r in out["roles"])
  _validate(out["sieve_bias"], out["distance"], out["lengths"], out["roles"])
  return out
