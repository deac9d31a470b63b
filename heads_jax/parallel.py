"""Data parallelism: a one-axis ``data`` mesh over all devices, and batches sharded on it.

This is the form in which JAX now implements ``pmap``: arrays carry a ``NamedSharding``
and ``jax.jit`` partitions the computation. The same code runs on a TPU v3-8 (8 cores),
one GPU, the CPU (tests emulate 8 devices) and multi-host pods, where each process feeds
its own slice of the global batch (``jax.make_array_from_process_local_data``).

Several host processes (a TPU pod, several GPU hosts, or several processes of one machine) join
through ``initialize_distributed`` before any other JAX call: a coordinator address, the number
of processes and this process's id, each discovered automatically on Cloud TPU pods and on
SLURM / Open MPI / Kubernetes clusters when left unset. On CPUs the processes exchange data
through the gloo collectives (``jax_cpu_collectives_implementation``).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def distributed_requested(enabled: bool = False, coordinator_address: str = "",
                          num_processes: int = 0, process_id: int = -1) -> bool:
  """Whether these settings ask for ``jax.distributed`` (any of them set)."""
  return bool(enabled or coordinator_address or (num_processes or 0) > 0
              or (process_id is not None and process_id >= 0))


def initialize_distributed(enabled: bool = False, coordinator_address: str = "",
                           num_processes: int = 0, process_id: int = -1,
                           cpu_collectives: str = "gloo") -> bool:
  """Joins the host processes of a multi-host run (``jax.distributed.initialize``).

  Does nothing unless a setting asks for it (``distributed_requested``) or when JAX is already
  initialised. Unset settings (``""``, ``0``, ``-1``) are left to JAX's auto-detection (Cloud
  TPU pods, SLURM, Open MPI, Kubernetes; ``JAX_COORDINATOR_ADDRESS`` from the environment).
  ``cpu_collectives`` selects the CPU cross-process collectives (``"gloo"``; ``"mpi"`` needs an
  MPI build). Returns whether this call initialised. Must run before any other JAX call that
  touches a device.
  """
  if not distributed_requested(enabled, coordinator_address, num_processes, process_id):
    return False
  if jax.distributed.is_initialized():
    return False
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  kwargs = {}
  if coordinator_address:
    kwargs["coordinator_address"] = coordinator_address
  if num_processes and num_processes > 0:
    kwargs["num_processes"] = int(num_processes)
  if process_id is not None and process_id >= 0:
    kwargs["process_id"] = int(process_id)
  jax.distributed.initialize(**kwargs)
  return True


def initialize_from_config(distributed) -> bool:
  """``initialize_distributed`` from a config's ``distributed`` block (a ConfigDict or dict with
  ``enabled``, ``coordinator_address``, ``num_processes``, ``process_id``; a bare bool is
  ``enabled``)."""
  if isinstance(distributed, bool) or distributed is None:
    return initialize_distributed(bool(distributed))
  get = distributed.get
  return initialize_distributed(
      enabled=bool(get("enabled", False)), coordinator_address=get("coordinator_address", "") or "",
      num_processes=int(get("num_processes", 0) or 0), process_id=int(get("process_id", -1)),
      cpu_collectives=get("cpu_collectives", "gloo") or "")


def shard_global_batch(batch: dict, mesh: Mesh) -> dict:
  """Puts a host batch that every process holds whole (the same global batch on each) on the
  mesh: each process supplies the rows of its own devices. On one process this is
  ``shard_batch``. The leading dimension must be divisible by the mesh's size."""
  if jax.process_count() == 1:
    return shard_batch(batch, mesh)
  sharding = batch_sharding(mesh)

  def put(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, batch)


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
  """Places a pytree (parameters, optimizer state) fully replicated on the mesh. With several
  host processes each process puts its own copy on its devices (every process passes the same
  values)."""
  sharding = replicated(mesh)
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def put(x):
    if not isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool)):
      return x
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = put(jax.random.key_data(x))
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(put, tree)
