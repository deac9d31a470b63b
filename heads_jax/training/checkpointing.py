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

Every call that waits on Orbax or TensorStore runs under ``heads_jax.storage.watch`` (a progress
line after 30 s, one line and exit 2 after ``HEADS_JAX_STORAGE_TIMEOUT``, naming the last complete
checkpoint). ``restore`` first compares the saved parameter shapes with the target's (another
model size: one ``UserError`` line naming the first difference), then restores the newest step;
a damaged newest step (a data file deleted or truncated, ``_METADATA`` deleted) is moved aside to
``damaged_checkpoints/`` beside the checkpoints with one line, and the previous step is restored.

An asynchronous save that fails in Orbax's background thread (a full disk, a permission error)
raises ``SaveFailed`` (a ``UserError`` naming the step's folder) at the next ``check`` (the
training loop calls it after every step, so training stops at once), ``save``, ``wait`` or
``close``; Orbax's own error logs (tracebacks from its threads) are held back while a
``Checkpoints`` is open, since that one line reports them.

Directories are ``etils.epath`` paths (``heads_jax.storage.as_path``): a local folder or a
``gs://`` URL, where Orbax writes the arrays through TensorStore's ``gcs`` driver. On several
host processes every process calls the same methods and Orbax writes one checkpoint (each
process its shards, process 0 the metadata).
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from heads_jax.errors import UserError
from heads_jax.model.convert import check_finite
from heads_jax.storage import as_path, call, display, watch

log = logging.getLogger(__name__)


class SaveFailed(UserError):
  """The checkpoint of ``step`` could not be written to ``directory/step``; ``cause``: why
  (the error Orbax's save raised, or None when the step's folder is simply missing after it)."""

  def __init__(self, step: int | None, directory, cause: BaseException | None, note: str):
    self.step, self.directory, self.cause, self.note = step, directory, cause, note
    super().__init__(self.line())

  def line(self, removed: str = "") -> str:
    """The message; ``removed``: what was cleaned up after it (said after the note)."""
    why = _first_line(self.cause) if self.cause is not None else "its folder is missing after the save"
    what = (f"the checkpoint of step {self.step} could not be written to "
            f"{display(as_path(self.directory) / str(self.step))}" if self.step is not None else
            f"a checkpoint could not be written to {display(self.directory)}")
    return (f"{what} ({why}); {self.note}{removed}; check that the storage is writable and has "
            f"space, then run the same command again")


class _OrbaxErrors(logging.Filter):
  """Holds back Orbax's error records (tracebacks logged by its save threads) while a
  ``Checkpoints`` is open: the failure they report is raised as one ``SaveFailed`` line. Also
  drops the unraisable ``RuntimeError("Event loop is closed")`` that gcsfs/aiohttp objects of a
  failed save's event loop raise when they are collected (``sys.unraisablehook``; any other
  unraisable exception goes to the hook that was there)."""

  def __init__(self):
    super().__init__()
    self.users = 0
    self.lock = threading.Lock()
    self.previous_hook = None

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and "orbax" in record.pathname.replace("\\", "/"))

  def unraisable(self, info) -> None:
    if isinstance(info.exc_value, RuntimeError) and "Event loop is closed" in str(info.exc_value):
      return
    (self.previous_hook or sys.__unraisablehook__)(info)

  def open(self) -> None:
    with self.lock:
      self.users += 1
      logging.getLogger("absl").addFilter(self)
      if self.users == 1:
        self.previous_hook, sys.unraisablehook = sys.unraisablehook, self.unraisable

  def close(self) -> None:
    with self.lock:
      self.users -= 1
      if self.users <= 0:
        self.users = 0
        logging.getLogger("absl").removeFilter(self)
        if sys.unraisablehook == self.unraisable:
          sys.unraisablehook = self.previous_hook or sys.__unraisablehook__
        self.previous_hook = None


_ORBAX_ERRORS = _OrbaxErrors()


class Checkpoints:
  """Periodic asynchronous checkpoints of one run in ``directory``."""

  def __init__(self, directory, *, save_interval_steps: int = 1000, max_to_keep: int | None = 3,
               async_save: bool = True):
    self.directory = as_path(directory)
    self.save_interval_steps = max(1, int(save_interval_steps))
    self.async_save = async_save
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=self.save_interval_steps, max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save, create=True)
    with watch("opening the checkpoints", self.directory):
      self.manager = ocp.CheckpointManager(
          self.directory, options=options,
          item_handlers={"state": ocp.StandardCheckpointHandler(),
                         "meta": ocp.JsonCheckpointHandler()})
      self.complete = self.manager.latest_step()  # the newest checkpoint known to be complete
    self.pending: int | None = None  # a save started and not known to be finished
    self.closed = False
    self.failed: SaveFailed | None = None  # a save that failed (raised once, kept for close)
    _ORBAX_ERRORS.open()

  def note(self) -> str:
    """Where a stopped run resumes: the last complete checkpoint (for messages)."""
    if self.complete is None:
      return f"no checkpoint in {display(self.directory)} is complete yet"
    return f"the last complete checkpoint is step {self.complete} in {display(self.directory)}"

  def latest_step(self) -> int | None:
    with watch("listing the checkpoints", self.directory, note=self.note):
      return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    with watch("listing the checkpoints", self.directory, note=self.note):
      return list(self.manager.all_steps())

  def is_due(self, step: int) -> bool:
    """Whether ``save(step, ...)`` saves without ``force``."""
    return step % self.save_interval_steps == 0

  def save(self, step: int, state, meta: dict | None = None, *, force: bool = False) -> bool:
    """Saves (asynchronously) when ``step`` is a multiple of the interval (or ``force``);
    returns whether it saved."""
    if not force and not self.is_due(step):
      return False
    if self.pending is not None:  # Orbax finishes the previous save before it starts the next
      self.wait()
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              meta=ocp.args.JsonSave(_jsonable(meta or {})))
    try:
      with watch(f"saving the checkpoint of step {step}", self.directory, note=self.note):
        saved = self.manager.save(int(step), args=args, force=force)
    except UserError:
      raise
    except Exception as e:  # noqa: BLE001 (a full disk, a permission error, ...)
      raise self._failed(step, e) from None
    if saved:
      self.pending = int(step)
      if not self.async_save:
        self.complete, self.pending = int(step), None
    return saved

  def _failed(self, step: int | None, cause: BaseException | None) -> SaveFailed:
    self.pending = None
    self.failed = SaveFailed(step, self.directory, cause, self.note())
    # Orbax reports the first item that failed while the others still write: let them end, so
    # that no thread writes into the partial step once it is removed (nor at exit).
    _join_orbax_threads()
    return self.failed

  def check(self) -> None:
    """Without waiting: raises ``SaveFailed`` when the save in flight has ended in failure
    (marks it complete when it has ended well)."""
    if self.pending is not None and not self.manager.is_saving_in_progress():
      self.wait()

  def restore(self, abstract_state, step: int | None = None, *, log=None):
    """Returns ``(state, meta)`` of ``step`` (default: the newest complete one) laid out as
    ``abstract_state`` (a pytree of ``jax.ShapeDtypeStruct`` with shardings, e.g.
    ``abstract_like(state)``).

    Saved parameters of other shapes (another model size): a ``UserError`` naming the first
    difference. Without ``step``, a newest step that cannot be read (damaged: ``is_damage``) is
    moved aside to ``damaged_checkpoints/`` with one line (``log``, default stderr) and the
    previous step is restored; none readable: a ``UserError``. Any other error (e.g. a target
    Orbax cannot restore into) is raised as it is, and no step is touched."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    steps_ = [step] if step is not None else sorted(self.all_steps(), reverse=True)
    if not steps_:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    aside_dir = self.directory.parent / "damaged_checkpoints"
    for i, s in enumerate(steps_):
      try:
        with watch(f"reading the checkpoint of step {s}", self.directory, note=self.note):
          saved = self.manager.item_metadata(s)["state"]
        if getattr(saved, "tree", saved) is None:
          raise _MissingMetadata("its state metadata (_METADATA) is missing")
      except Exception as e:  # noqa: BLE001 (unreadable metadata is damage; a bug is raised)
        if not is_damage(e):
          raise
        error = e
      else:
        check_shapes(saved, abstract_state, display(self.directory / str(s)),
                     "the run's own checkpoints (another model size; resume with the run's "
                     "config.json or choose another --workdir)")
        try:
          with watch(f"restoring the checkpoint of step {s}", self.directory, note=self.note):
            out = self.manager.restore(s, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
          self.complete = s
          return out.state, dict(out.meta or {})
        except UserError:
          raise
        except Exception as e:  # noqa: BLE001 (a torn step: a read error; a bug is raised)
          if not is_damage(e):
            raise
          error = e
      if step is not None:
        raise UserError(f"the checkpoint of step {s} in {display(self.directory)} cannot be read "
                        f"({_first_line(error)})") from None
      where = self.set_aside(s, aside_dir)
      rest = steps_[i + 1:]
      where = "deleted it" if where == "deleted" else f"moved it to {where}"
      log(f"checkpoint step {s} in {display(self.directory)} is damaged ({_first_line(error)}); "
          f"{where}; " + (f"restoring step {rest[0]}" if rest else
                                      "no earlier checkpoint: starting afresh"))
    self.complete = None
    raise FileNotFoundError(f"no readable checkpoint in {self.directory}")

  def delete(self, step: int) -> None:
    self.manager.delete(int(step))

  def set_aside(self, step: int, to) -> str:
    """Moves the checkpoint of ``step`` out of the run into ``to/STEP`` (nothing written is lost,
    and a resumed run no longer sees it); returns where it went. Where the store cannot rename a
    folder (a bucket), its files are copied there and the step deleted; only when that copy
    fails too is the checkpoint deleted without a copy, and ``"deleted"`` returned."""
    if self.pending is not None:
      self.wait()
    src = self.directory / str(int(step))
    dest = as_path(to) / str(int(step))
    n = 1
    while dest.exists():  # an earlier one set aside under that step
      dest, n = as_path(to) / f"{int(step)}.{n}", n + 1
    try:
      dest.parent.mkdir(parents=True, exist_ok=True)
      try:
        _rename(src, dest)
      except OSError:
        try:
          _copy_tree(src, dest)
        except OSError:
          self.manager.delete(int(step))
          return "deleted"
        self.manager.delete(int(step))
    finally:
      self.manager.reload()
    return str(dest)

  def wait(self):
    if self.closed:
      return
    what = (f"finishing the checkpoint of step {self.pending}" if self.pending is not None else
            "finishing the checkpoints")
    try:
      with watch(what, self.directory, note=self.note):
        self.manager.wait_until_finished()
    except UserError:
      raise
    except Exception as e:  # noqa: BLE001 (the background save failed)
      if self.pending is None and self.failed is not None:  # reported already
        return
      raise self._failed(self.pending, e) from None
    if self.pending is not None:
      step = self.pending
      if jax.process_index() == 0 and not call(lambda: (self.directory / str(step)).exists(),
                                               what="checking", path=self.directory):
        raise self._failed(step, None)
      self.complete, self.pending = step, None

  def close(self):
    """Waits for the save in flight and closes the manager; a failed save (``SaveFailed``) is
    raised after the manager is closed (a failure raised before is not raised again)."""
    if self.closed:
      return
    try:
      self.wait()
    finally:
      self.closed = True
      try:
        with watch("closing the checkpoints", self.directory, note=self.note):
          try:
            self.complete = self.manager.latest_step()  # a save interrupted in Orbax's call
          finally:
            self.manager.close()
      except UserError:
        raise
      except Exception as e:  # noqa: BLE001 (Orbax re-raises a failed save's error on close)
        if self.failed is None:
          raise self._failed(None, e) from None
        _close_quietly(self.manager)
      finally:
        _ORBAX_ERRORS.close()

  def remove_partial(self) -> list[str]:
    """Removes what an interrupted or failed save left (Orbax's temporary step folders);
    returns their names. Complete checkpoints are never touched."""
    removed = []
    try:
      children = list(self.directory.iterdir()) if self.directory.exists() else []
    except OSError:
      return removed
    for child in children:
      if ".orbax-checkpoint-tmp" in child.name or child.name.endswith(".tmp"):
        try:
          child.rmtree() if child.is_dir() else child.unlink()
          removed.append(child.name)
        except OSError:
          pass
    return removed


def _rename(src, dest) -> None:
  src.rename(dest)


def _copy_tree(src, dest) -> None:
  """Copies every file under ``src`` to the same place under ``dest`` (epath: local or a bucket,
  where a folder cannot be renamed)."""
  dest.mkdir(parents=True, exist_ok=True)
  for f in src.iterdir():            # epath has no recursive glob on buckets: walk
    if f.is_dir():
      _copy_tree(f, dest / f.name)
    else:
      f.copy(dest / f.name)


def _join_orbax_threads(timeout: float = 60.0) -> None:
  """Waits (at most ``timeout`` seconds) for the threads Orbax started for a save to end.

  Through ``threading.Thread.join``, not the thread's own: Orbax's save threads
  (``_FinalizeThread``, ``_SignalingThread``) re-raise their error from ``join``, and a second
  thread of the failed save still running here (a slow or loaded machine) would raise the same
  error again, out of the handler that is turning the first into one ``SaveFailed`` line."""
  import time
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    busy = [t for t in threading.enumerate() if t is not threading.current_thread() and
            t.is_alive() and type(t).__module__.startswith("orbax")]
    if not busy:
      return
    threading.Thread.join(busy[0], max(0.0, deadline - time.monotonic()))


def _close_quietly(manager) -> None:
  """Closes what ``manager.close`` left open when it re-raised a failed save's error (its
  checkpointer's threads and metadata stores), ignoring further errors."""
  for part in ("_checkpointer", "_non_blocking_metadata_store", "_blocking_metadata_store",
               "_checkpoint_deleter"):
    try:
      getattr(manager, part).close()
    except Exception:  # noqa: BLE001
      pass


# TensorStore's status codes in a failed read, in plain words
_STORE_CODES = (("OUT_OF_RANGE", "a data file is shorter than its index says (truncated)"),
                ("DATA_LOSS", "a data file is corrupt"), ("NOT_FOUND", "a file is missing"))


class _MissingMetadata(ValueError):
  """A checkpoint step whose state metadata is missing (damage)."""


# TensorStore's status codes of a stored checkpoint that cannot be read (first in its message)
_READ_ERRORS = ("NOT_FOUND", "OUT_OF_RANGE", "DATA_LOSS", "FAILED_PRECONDITION", "UNAVAILABLE",
                "PERMISSION_DENIED")


def is_damage(error: BaseException) -> bool:
  """Whether ``error`` (raised reading a checkpoint) says the stored step is damaged (a file
  missing, cut short or corrupt, its metadata missing or not JSON), as opposed to a caller's
  error (a target of the wrong type), which must not get the step set aside or deleted."""
  import json
  if isinstance(error, (OSError, EOFError, _MissingMetadata, json.JSONDecodeError)):
    return True
  first = str(error).lstrip()
  return first.startswith(_READ_ERRORS)


def _first_line(error: BaseException) -> str:
  """The error's first line (its type and up to 200 characters), or for a TensorStore status
  code in it, what the code means and the code."""
  text = str(error).strip().splitlines()
  for code, what in _STORE_CODES:
    if text and code in text[0]:
      return f"{what}: {code}"
  return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def _key_text(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _shapes(tree) -> dict:
  """``{"a/b/c": shape}`` of every leaf of a (pure dict) tree with shapes."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape = getattr(leaf, "shape", None)
    if shape is not None:
      out["/".join(_key_text(k) for k in path)] = tuple(shape)
  return out


def check_shapes(saved, target, where: str, what: str) -> None:
  """Raises a ``UserError`` when the parameters of ``target`` (a tree with a ``params`` subtree,
  or params) and those of the saved metadata ``saved`` differ in shape, or ``target`` has
  parameters ``saved`` lacks. ``where``: the checkpoint; ``what``: what it is and what to do."""
  saved = getattr(saved, "tree", saved)  # Orbax's TreeMetadata
  saved_p = saved.get("params", saved) if isinstance(saved, dict) else saved
  target_p = target.get("params", target) if isinstance(target, dict) else target
  have, want = _shapes(saved_p), _shapes(target_p)
  diffs = [f"{k} is {list(have[k])} there, {list(want[k])} here" for k in want
           if k in have and have[k] != want[k]]
  missing = [k for k in want if k not in have]
  if not diffs and not missing:
    return
  first = diffs[0] if diffs else f"it has no {missing[0]}"
  more = len(diffs) + len(missing) - 1
  raise UserError(f"{where} holds a model of another shape than this run's ({first}"
                  f"{f', and {more} more differences' if more > 0 else ''}): {what}")


def abstract_like(tree):
  """``jax.ShapeDtypeStruct`` (with sharding) for every array leaf of ``tree``."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class DamagedCheckpoint(UserError):
  """A checkpoint whose metadata cannot be read or whose restore fails part-way (a torn or
  half-deleted step): the caller may set that step aside and go on (``heads-jax trajectory``).
  ``reason``: what is wrong in a few words (the error's first line, TensorStore's codes in plain
  words), for a caller that words its own line."""

  def __init__(self, message: str, reason: str = ""):
    super().__init__(message)
    self.reason = reason


def _saved_keys(target, saved):
  """``target`` (a pure dict) cut to the keys ``saved`` (a checkpoint's metadata tree) also has
  (a layer's key is an int here, a str in the checkpoint)."""
  if not isinstance(target, dict):
    return target
  out = {}
  for k, v in target.items():
    key = k if k in saved else str(k)
    if isinstance(saved, dict) and key in saved:
      out[k] = _saved_keys(v, saved[key])
  return out


def restore_params_from_run(directory, abstract_params, step: int | None = None, *,
                            what: str = "init_checkpoint", only_saved: bool = False,
                            advice: str | None = None):
  """The ``params`` of an Orbax checkpoint written by another run (e.g. pre-training phase 1),
  ignoring its optimizer state; returns ``(params, step)``. ``directory`` is that run's
  checkpoint directory; ``abstract_params`` may be a subtree of the saved params (e.g.
  ``{"bert": ...}`` to take only the encoder of a pre-training run), every other saved leaf is
  skipped. ``step``: that step (default the latest). ``what`` names the checkpoint in messages
  (``heads-jax trajectory``: "the checkpoint of step N"). ``only_saved``: first cut
  ``abstract_params`` to the parameters the checkpoint holds (a span model's encoder has no
  pooler). Unreadable metadata or a failed restore raise ``DamagedCheckpoint`` (a
  ``UserError`` with a ``reason``); the manager is closed however it ends. ``advice``: what to do,
  in place of the default advice of a shape mismatch and of a damaged checkpoint (the caller's
  own flags)."""
  directory = as_path(directory)
  damaged_advice = advice or "pass another step's folder or that run's exported model"
  with watch(f"opening the {what}", directory):
    mngr = ocp.CheckpointManager(directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()},
                                 options=ocp.CheckpointManagerOptions(read_only=True, create=False))
  try:
    step = mngr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {directory}")
    where = display(directory / str(step))
    try:
      with watch(f"reading the {what} of step {step}", directory):
        saved = mngr.item_metadata(step)["state"]
      if getattr(saved, "tree", saved) is None:
        raise ValueError("its state metadata (_METADATA) is missing")
    except Exception as e:  # noqa: BLE001
      reason = _first_line(e)
      raise DamagedCheckpoint(f"{what} {where} cannot be read ({reason}); {damaged_advice}",
                              reason) from None
    if only_saved:
      tree = getattr(saved, "tree", saved)
      saved_params = tree.get("params", tree) if isinstance(tree, dict) else tree
      abstract_params = _saved_keys(abstract_params, saved_params)
    check_shapes(saved, {"params": abstract_params}, f"{what} {where}",
                 advice or "set --config.model.size (and the other model fields) to that "
                 "run's, or start from another run")
    # Restore only the params subtree (partial restore): the optimizer state is skipped.
    target = {"params": abstract_params}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    try:
      with watch(f"restoring the {what} of step {step}", directory):
        restored = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args,
                                         partial_restore=True)))
    except (UserError, KeyboardInterrupt):
      raise
    except Exception as e:  # noqa: BLE001  (a torn step: files missing or cut short)
      reason = _first_line(e)
      raise DamagedCheckpoint(f"{what} {where} cannot be restored ({reason}); {damaged_advice}",
                              reason) from None
  finally:
    mngr.close()
  params = restored.state["params"]
  check_finite_params(params, f"{what} {where}")
  return params, step


def check_finite_params(params, where: str) -> None:
  """Raises a ``UserError`` naming the first parameter of ``params`` (a tree of arrays) with NaN
  or infinite values, and ``where`` it was read from (``heads_jax.model.convert.check_finite``);
  the test runs on the device, only the failing tensor comes to the host."""
  flat = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
          if jnp.issubdtype(x.dtype, jnp.floating)]
  finite = jax.device_get([jnp.isfinite(x).all() for _, x in flat])
  for (path, x), ok in zip(flat, finite):
    if not ok:
      check_finite({"/".join(_key_text(k) for k in path): np.asarray(jax.device_get(x))}, where)


def is_orbax_run_dir(path) -> bool:
  """A directory of numbered Orbax step folders (a training run's checkpoints)."""
  p = as_path(path)
  return call(lambda: p.is_dir() and any(c.name.isdigit() and c.is_dir() for c in p.iterdir()),
              what="listing", path=p)


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
