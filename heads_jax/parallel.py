"""Data parallelism: a one-axis ``data`` mesh over all devices, and batches sharded on it.

This is the form in which JAX now implements ``pmap``: arrays carry a ``NamedSharding``
and ``jax.jit`` partitions the computation. The same code runs on a TPU v3-8 (8 cores),
one GPU, the CPU (tests emulate 8 devices) and multi-host pods, where each process feeds
its own slice of the global batch (``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def data_mesh(devices=None) -> Mesh:
  """A one-axis mesh named ``data`` over ``devices`` (default: all devices of all hosts)."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``data``; other axes replicated."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def pad_to_multiple(batch: dict, multiple: int) -> tuple[dict, int]:
  """Pads every ``[b, ...]`` array of ``batch`` with zero rows to a multiple of ``multiple``.

  Returns ``(padded, b)`` where ``b`` is the number of real rows. Zero rows have an
  all-zero ``attention_mask`` where the batch has one, so they are masked out by every
  statistic; callers drop rows ``b:`` of the results.
  """
  b = len(next(iter(batch.values())))
  target = -(-b // multiple) * multiple
  if target == b:
    return batch, b
  padded = {}
  for name, x in batch.items():
    x = np.asarray(x)
    pad = np.zeros((target - b,) + x.shape[1:], x.dtype)
    if name in ("word_ids", "dep_head"):
      pad[:] = -1
    padded[name] = np.concatenate([x, pad], axis=0)
  return padded, b


def shard_batch(batch: dict, mesh: Mesh) -> dict:
  """Puts a host batch (global on one process, or this process's slice on many) on the mesh.

  The leading dimension must be divisible by the number of devices of this process
  (see ``pad_to_multiple``).
  """
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


def replicate(tree, mesh: Mesh):
  """Places a pytree (parameters, optimizer state) fully replicated on the mesh."""
  return jax.device_put(tree, replicated(mesh))
