"""Orbax checkpoints of the full train state, for exact resume.

A train state is a plain pytree ``{"step": int32 [], "params": pure dict, "opt_state": optax
state}`` (see ``heads_jax.training.steps``). ``Checkpoints`` wraps ``ocp.CheckpointManager``:

* items ``state`` (``ocp.args.StandardSave`` / ``StandardRestore``: every array, restored
  directly with the shardings of the abstract target, so a checkpoint written on one device
  layout restores on another) and ``meta`` (``ocp.args.JsonSave``: the data position, metrics,
  the config);
* asynchronous saves (``enable_async_checkpointing``) every ``save_interval_steps`` steps,
  keeping the last ``max_to_keep`` (fine-tuning keeps its best evaluation in a second
  ``Checkpoints`` it saves to only on improvement).

Because batch ``N`` of every data stream here is a function of ``(seed, N)`` and the dropout key
of step ``N`` is ``fold_in(key, N)``, restoring step ``N`` and training on gives the same
parameters and losses as a run that was never interrupted.

``restore_params_from_run`` reads the parameters (only) of another run's checkpoints, e.g.
phase 1 for phase 2 of pre-training; its restore arguments come from Orbax's
``checkpoint_utils.construct_restore_args``.

Directories are ``etils.epath`` paths (``heads_jax.storage.as_path``): a local folder or a
``gs://`` URL, where Orbax writes the arrays through TensorStore's ``gcs`` driver. On several
host processes every process calls the same methods and Orbax writes one checkpoint (each
process its shards, process 0 the metadata).
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from heads_jax.storage import as_path

log = logging.getLogger(__name__)


class Checkpoints:
  """Periodic asynchronous checkpoints of one run in ``directory``."""

  def __init__(self, directory, *, save_interval_steps: int = 1000, max_to_keep: int | None = 3,
               async_save: bool = True):
    self.directory = as_path(directory)
    self.save_interval_steps = max(1, int(save_interval_steps))
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=self.save_interval_steps, max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def is_due(self, step: int) -> bool:
    """Whether ``save(step, ...)`` saves without ``force``."""
    return step % self.save_interval_steps == 0

  def save(self, step: int, state, meta: dict | None = None, *, force: bool = False) -> bool:
    """Saves (asynchronously) when ``step`` is a multiple of the interval (or ``force``);
    returns whether it saved."""
    if not force and not self.is_due(step):
      return False
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              meta=ocp.args.JsonSave(_jsonable(meta or {})))
    return self.manager.save(int(step), args=args, force=force)

  def restore(self, abstract_state, step: int | None = None):
    """Returns ``(state, meta)`` of ``step`` (default: the latest) laid out as ``abstract_state``
    (a pytree of ``jax.ShapeDtypeStruct`` with shardings, e.g. ``abstract_like(state)``)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return out.state, dict(out.meta or {})

  def delete(self, step: int) -> None:
    self.manager.delete(int(step))

  def set_aside(self, step: int, to) -> str:
    """Moves the checkpoint of ``step`` out of the run into ``to/STEP`` (nothing written is lost,
    and a resumed run no longer sees it); returns where it went. Where the store cannot rename a
    folder, the checkpoint is deleted instead and ``"deleted"`` returned."""
    self.wait()
    src = self.directory / str(int(step))
    dest = as_path(to) / str(int(step))
    try:
      dest.parent.mkdir(parents=True, exist_ok=True)
      src.rename(dest)
    except OSError:
      self.manager.delete(int(step))
      return "deleted"
    finally:
      self.manager.reload()
    return str(dest)

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_like(tree):
  """``jax.ShapeDtypeStruct`` (with sharding) for every array leaf of ``tree``."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def restore_params_from_run(directory, abstract_params, step: int | None = None):
  """The ``params`` of an Orbax checkpoint written by another run (e.g. pre-training phase 1),
  ignoring its optimizer state. ``directory`` is that run's checkpoint directory;
  ``abstract_params`` may be a subtree of the saved params (e.g. ``{"bert": ...}`` to take only
  the encoder of a pre-training run), every other saved leaf is skipped."""
  directory = as_path(directory)
  mngr = ocp.CheckpointManager(directory, item_names=("state", "meta"),
                               options=ocp.CheckpointManagerOptions(read_only=True, create=False))
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  # Restore only the params subtree (partial restore): the optimizer state is skipped.
  target = {"params": abstract_params}
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)))
  mngr.close()
  return restored.state["params"], step


def is_orbax_run_dir(path) -> bool:
  """A directory of numbered Orbax step folders (a training run's checkpoints)."""
  p = as_path(path)
  return p.is_dir() and any(c.name.isdigit() and c.is_dir() for c in p.iterdir())


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.generic,)):
    return x.item()
  if isinstance(x, np.ndarray) or isinstance(x, jax.Array):
    return np.asarray(x).tolist()
  if isinstance(x, Path) or hasattr(x, "__fspath__"):
    return str(x)
  return x
