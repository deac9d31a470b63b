"""The training loop shared by pre-training and fine-tuning.

``initial_state`` decides where a run starts, in this order:

1. the latest checkpoint of this run (``workdir/checkpoints``): the full train state, so
   the run continues exactly where it stopped (same data position, same dropout keys);
2. ``init_checkpoint``: an Orbax run directory (another run's ``checkpoints``, e.g. phase 1 of
   pre-training: its *parameters only*; optimizer state and schedule start afresh, as the
   BERT/NVIDIA two-phase recipe does), a heads_jax model directory or a Hugging Face BERT
   directory (heads absent there are freshly initialised);
3. a fresh initialisation with ``seed``.

``train_loop`` runs steps ``start .. total - 1``; each step takes the host batch of that step
number (a pure function of the data seed and the step), shards it over the mesh, and applies
the jitted step. It logs averaged metrics every ``log_every`` steps (JSON lines, TensorBoard,
a progress line), evaluates every ``eval_every`` steps, saves a checkpoint when the
checkpoint interval is due (and always at the last step, at ``stop_at_step``, and on SIGTERM or
Ctrl-C: ``StopFlag``, read after the step's host work, so the step a signal lands in is saved),
and returns the per-step history of the logged metrics. A failed asynchronous save
(``checkpointing.SaveFailed``) stops the run before the next step.

The input pipeline is measured at each log: ``input_wait_fraction`` is the share of the
interval the loop spent waiting for the next batch (the first batch of a run segment, when the
workers start, not counted): while the device computes a step the loop waits for nothing, so
any waiting is time the device sat idle. A batch stream with ``take_stats``
(``heads_jax.data.prefetch.BatchStream``) adds ``batch_build_s`` and
``input_capacity_per_s``. Above ``STARVED`` (5%), unless the builders make ``HEADROOM`` (2) times
the batches the loop takes, the log says so in one line, with what to change.

A loss or gradient norm that is not finite stops the run with ``NonFiniteLoss`` (a
``UserError``). The loop checks the metrics of every step at each log and before each save, so
no checkpoint is written after such a step; the state saved just before the first non-finite
loss (whose parameters produced it) is moved out of the run (to ``nonfinite_checkpoints/`` beside
the checkpoints: nothing written is lost), so the newest checkpoint left is the last good one and
running the same command again (e.g. with a lower learning rate) resumes from it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import signal
import time
from typing import Callable, Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from heads_jax.storage import as_path, exists as storage_exists, is_url, local_copy
from heads_jax.errors import UserError
from heads_jax.model.loading import load_model
from heads_jax.parallel import shard_batch
from heads_jax.training import checkpointing, metrics as metrics_lib, steps

log = logging.getLogger(__name__)


def abstract_state(params, tx, mesh):
  """Shapes, dtypes and (replicated) shardings of ``init_train_state(params, tx)``."""
  shapes = jax.eval_shape(lambda p: steps.init_train_state(p, tx), params)
  rep = NamedSharding(mesh, P())
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), shapes)


def load_init_model(init_checkpoint: str, head: str, *, num_labels: int | None = None,
                    dtype: str | None = None):
  """A model (with heads ``head``) from a heads_jax or Hugging Face directory, or None when
  ``init_checkpoint`` is empty or an Orbax run directory (handled by ``initial_state``)."""
  if not init_checkpoint or checkpointing.is_orbax_run_dir(init_checkpoint):
    return None
  if is_url(init_checkpoint) and storage_exists(as_path(init_checkpoint) / "checkpoints"):
    raise UserError(f"init_checkpoint {init_checkpoint} is a training run's work directory, not a "
                    f"model: give its exported model ({init_checkpoint}/model or "
                    f"{init_checkpoint}/best_model) or its parameters "
                    f"({init_checkpoint}/checkpoints)")
  if not storage_exists(init_checkpoint):
    raise FileNotFoundError(f"init_checkpoint {init_checkpoint} does not exist: pass a heads_jax "
                            f"model directory, a Hugging Face BERT directory or a run's "
                            f"checkpoints directory")
  # A model directory in cloud storage is mirrored once into the local cache (storage.local_copy).
  model, _ = load_model(local_copy(init_checkpoint), head=head, num_labels=num_labels, dtype=dtype,
                        with_tokenizer=False)
  return model


def initial_state(*, model, tx, mesh, ckpts: checkpointing.Checkpoints, init_checkpoint: str = "",
                  init_subtree: str | None = None):
  """``(parts, state, start_step, origin)`` following the order of the module docstring.

  ``model`` is a concrete model of the run's architecture (freshly initialised, or loaded from
  ``init_checkpoint`` by ``load_init_model``); its parameters are used unless a checkpoint wins.
  ``init_subtree`` (e.g. ``"bert"``): take only that part of an Orbax run's parameters (the
  encoder of a pre-training run for fine-tuning); the rest keeps ``model``'s values.
  """
  parts, params = steps.split_model(model)
  if ckpts.latest_step() is not None:
    try:  # a damaged newest step is set aside and the previous one restored
      state, _ = ckpts.restore(abstract_state(params, tx, mesh))
    except FileNotFoundError:  # none readable (each set aside with a line): start afresh
      state = None
    if state is not None:
      step = int(steps.to_host(state["step"]))
      log.info("resumed from %s at step %d", ckpts.directory, step)
      return parts, state, step, f"resumed:{ckpts.directory}@{step}"
  origin = "fresh"
  if init_checkpoint and checkpointing.is_orbax_run_dir(init_checkpoint):
    rep = NamedSharding(mesh, P())
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), params)
    if init_subtree:
      sub, from_step = checkpointing.restore_params_from_run(
          init_checkpoint, {init_subtree: target[init_subtree]})
      params = dict(params)
      params[init_subtree] = sub[init_subtree]
    else:
      params, from_step = checkpointing.restore_params_from_run(init_checkpoint, target)
    origin = f"params:{init_checkpoint}@{from_step}"
  elif init_checkpoint:
    origin = f"model:{init_checkpoint}"
  state = steps.place_state(steps.init_train_state(params, tx), mesh)
  log.info("starting from %s", origin)
  return parts, state, 0, origin


STARVED = 0.05   # the share of a logging interval spent waiting for batches that is reported
HEADROOM = 2.0   # ... unless the stream's builders make this many times the batches the loop takes
# Whether the starvation line's advice (data.num_workers) is the user's to take: a job that
# runs training with settings of its own (the demo) turns it off (`no_input_advice`).
_INPUT_ADVICE = contextvars.ContextVar("input_advice", default=True)


@contextlib.contextmanager
def no_input_advice():
  """Within it, a starving input pipeline is not reported on the console (the metrics still
  record ``input_wait_fraction``): the caller's user cannot set ``data.num_workers``."""
  token = _INPUT_ADVICE.set(False)
  try:
    yield
  finally:
    _INPUT_ADVICE.reset(token)


def starving(avg: dict) -> bool:
  """Whether a log's scalars (``avg``) say the input starves the device: the loop waited more
  than ``STARVED`` of the interval for batches and, where the stream measured its builders, they
  make fewer than ``HEADROOM`` times the batches the loop took (builders far faster than the
  steps leave only the hand-off's wait, which more workers would not shorten)."""
  if avg.get("input_wait_fraction", 0.0) <= STARVED:
    return False
  capacity, rate = avg.get("input_capacity_per_s"), avg.get("steps_per_s")
  return capacity is None or rate is None or capacity < HEADROOM * rate


def starved_line(avg: dict, steps: int, workers: int | None) -> str:
  """The log's line when the input pipeline starves the device (``avg``: a log's scalars)."""
  line = (f"input pipeline starves the device: the loop waited {100 * avg['input_wait_fraction']:.0f}% "
          f"of the last {steps} steps for batches")
  if "batch_build_s" in avg and "input_capacity_per_s" in avg:
    line += (f"; a batch takes {avg['batch_build_s']:.2f} s to build, so "
             f"{'one thread' if not workers else f'{workers} worker process(es)'} make at most "
             f"{avg['input_capacity_per_s']:.1f} batches/s")
  if "steps_per_s" in avg:
    line += f" for {avg['steps_per_s']:.1f} steps/s"
  return line + ("; raise data.num_workers (-1 picks them from the host's cores) or run on a host "
                 "with more cores")


class StopFlag:
  """Set by SIGTERM (pre-emption) or SIGINT (Ctrl-C): the loop finishes the step it is in, saves
  its checkpoint and returns; the caller reads ``stop`` and ``signal`` (``"SIGTERM"`` or
  ``"SIGINT"``, the first one received) afterwards (``heads_jax.training.job`` then exits with
  143 or 130). No exception is raised inside the step, so none lands in Orbax's threads; a second
  signal (Ctrl-C or SIGTERM) raises ``KeyboardInterrupt`` in the main thread (to stop at once,
  e.g. during a long evaluation; ``second`` names it). Re-entrant: the job holds it over the
  loop and the closing of the checkpoints, the loop enters it again."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.stop = False
    self.signal: str | None = None
    self.second: str | None = None
    self._old: dict = {}
    self._depth = 0

  def __enter__(self):
    self._depth += 1
    if self._depth == 1:
      for s in self.SIGNALS:
        try:
          self._old[s] = signal.signal(s, self._handle)
        except ValueError:  # not in the main thread
          pass
    return self

  def _handle(self, signum, _frame):
    if self.stop:  # a second signal: stop now (in a long evaluation too); ``second`` says which
      self.second = signal.Signals(signum).name
      raise KeyboardInterrupt
    self.stop = True
    self.signal = self.signal or signal.Signals(signum).name

  def __exit__(self, *exc):
    self._depth -= 1
    if self._depth == 0:
      for s, old in self._old.items():
        signal.signal(s, old)
      self._old = {}


class NonFiniteLoss(UserError):
  """The loss (or the gradient norm) of ``step`` is ``value``, not finite; ``last_good`` is the
  newest checkpoint left in ``directory`` (None: none)."""

  def __init__(self, step: int, value: float, last_good: int | None, directory,
               set_aside: tuple[int, ...] = (), aside_dir=None):
    self.step, self.value, self.last_good, self.directory = step, value, last_good, directory
    where = (f"the last good checkpoint is step {last_good} in {directory} (running again "
             f"resumes from it)" if last_good is not None else
             "no good checkpoint was saved before it")
    if set_aside:
      where += (f"; moved the checkpoint(s) of step {', '.join(map(str, set_aside))} that led to it "
                f"to {aside_dir}")
    super().__init__(f"the loss is {value} at step {step}; {where}")


def _first_non_finite(host: list[dict], first_step: int):
  """``(step, value, first bad state)`` of the first of ``host`` (the metrics of steps
  ``first_step, first_step + 1, ...``) whose loss or gradient norm is not finite, else None.
  A non-finite loss at step k condemns the state after k - 1 steps (its parameters produced
  it); a non-finite gradient norm the state after step k (its update)."""
  for i, m in enumerate(host):
    k = first_step + i
    if "loss" in m and not np.isfinite(m["loss"]):
      return k, float(m["loss"]), k - 1
    if "grad_norm" in m and not np.isfinite(m["grad_norm"]):
      return k, float(m.get("loss", m["grad_norm"])), k
  return None


def _stop_non_finite(bad, ckpts: checkpointing.Checkpoints | None):
  step, value, first_bad_state = bad
  last_good, directory, moved, aside = None, None, [], None
  if ckpts is not None:
    ckpts.wait()
    moved = [s for s in ckpts.all_steps() if s >= first_bad_state]
    aside = ckpts.directory.parent / "nonfinite_checkpoints"
    if any(ckpts.set_aside(s, aside) == "deleted" for s in moved):
      aside = "nowhere (deleted: this store cannot rename folders)"
    last_good, directory = ckpts.latest_step(), ckpts.directory
  raise NonFiniteLoss(step, value, last_good, directory, tuple(sorted(moved)), aside)


def train_loop(*, state, train_step, batches: Iterator[dict], mesh, start_step: int,
               total_steps: int, ckpts: checkpointing.Checkpoints | None,
               writer: metrics_lib.MetricsWriter | None, throughput: metrics_lib.Throughput | None,
               log_every: int = 100, eval_every: int = 0, eval_fn: Callable | None = None,
               meta_fn: Callable[[int], dict] | None = None, stop_at_step: int = 0,
               print_fn: Callable[[str], None] | None = print,
               stop_flag: StopFlag | None = None) -> tuple[dict, list[dict]]:
  """Runs the steps ``start_step .. total_steps - 1``; returns ``(state, history)``.

  ``batches`` yields the host batches of steps ``start_step, start_step + 1, ...``.
  ``eval_fn(state, step) -> dict`` is called every ``eval_every`` steps and at the end.
  ``history`` holds one dict per logged step (``step`` = number of steps done). Raises
  ``NonFiniteLoss`` (see the module docstring) and ``checkpointing.SaveFailed``. ``stop_flag`` (a
  ``StopFlag``): the SIGTERM/SIGINT handlers' flag, for the caller to see whether (and by which
  signal) the run was stopped.
  """
  history: list[dict] = []
  pending: list[dict] = []
  last = stop_at_step if 0 < stop_at_step < total_steps else total_steps
  step = start_step
  if throughput is not None:
    throughput.reset(step)
  is_main = jax.process_index() == 0
  waited = [0.0, time.perf_counter()]   # seconds waited for batches, start of the interval
  take_stats = getattr(batches, "take_stats", None)
  workers = getattr(batches, "workers", None)
  said_starved: list = []

  def flush():
    """Logs the metrics of the steps not logged yet (their average); stops on a non-finite one."""
    host = steps.to_host(pending)
    pending.clear()
    bad = _first_non_finite(host, step - len(host) + 1)
    avg = {k: float(np.mean([h[k] for h in host])) for k in host[0]}
    if throughput is not None:
      avg.update(throughput.update(step))
    interval = (len(host) / avg["steps_per_s"] if avg.get("steps_per_s")
                else time.perf_counter() - waited[1])
    if interval > 0:
      avg["input_wait_fraction"] = min(1.0, waited[0] / interval)
    if take_stats is not None:
      stats = take_stats()
      avg.update({k: stats[k] for k in ("batch_build_s", "input_capacity_per_s") if k in stats})
    waited[0], waited[1] = 0.0, time.perf_counter()
    avg["step"] = step
    history.append(avg)
    if writer is not None:
      writer.write(step, {k: v for k, v in avg.items() if k != "step"}, "train")
    if print_fn is not None and is_main:
      print_fn(metrics_lib.progress_line(step, total_steps, avg))
      if starving(avg) and not said_starved and _INPUT_ADVICE.get():   # once a run: the advice does not change
        said_starved.append(True)
        print_fn(starved_line(avg, len(host), workers))
    if bad is not None:
      _stop_non_finite(bad, ckpts)

  def save(force: bool) -> None:
    if pending:  # steps not checked by a log yet: check them before saving
      bad = _first_non_finite(steps.to_host(pending), step - len(pending) + 1)
      if bad is not None:
        _stop_non_finite(bad, ckpts)
    meta = meta_fn(step) if meta_fn else {}
    ckpts.save(step, state, meta, force=force)

  with (stop_flag or StopFlag()) as flag:
    while step < last:
      if ckpts is not None:
        ckpts.check()  # a failed asynchronous save stops the run before another step
      t_wait = time.perf_counter()
      batch = next(batches)
      if step > start_step:  # the first batch waits for the workers to start
        waited[0] += time.perf_counter() - t_wait
      state, m = train_step(state, shard_batch(batch, mesh))
      pending.append(m)
      step += 1
      if step % log_every == 0 or step == last:
        flush()
      if eval_fn is not None and ((eval_every and step % eval_every == 0) or step == total_steps):
        t0 = time.perf_counter()
        ev = eval_fn(state, step)
        if ev and writer is not None:
          writer.write(step, ev, "eval")
        if ev and print_fn is not None and is_main:
          print_fn(f"eval @ {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in ev.items()
                                                 if isinstance(v, (int, float))))
        if throughput is not None:  # do not count evaluation time as training time
          throughput._t += time.perf_counter() - t0
      # The stop flag is read after the step's host work (the wait for the device, logging,
      # evaluation): a signal that arrived during any of it is answered with this step's
      # checkpoint. It is read again after the save, so one that arrives during the save stops
      # here too (saving this step if the save was not its own).
      stop = flag.stop
      saved = False
      if ckpts is not None and (step == last or stop or ckpts.is_due(step)):
        if stop and pending:
          flush()
        save(force=step == last or stop)
        saved = True
      if flag.stop:
        if pending:
          flush()
        if ckpts is not None and not saved:
          save(force=True)
        log.info("%s: saved step %d and stopping", flag.signal, step)
        break
  if ckpts is not None:
    ckpts.wait()
  return state, history


def device_summary() -> dict:
  d = jax.devices()
  return {"platform": d[0].platform, "device_kind": d[0].device_kind, "num_devices": len(d),
          "process_count": jax.process_count(), "process_index": jax.process_index()}


def device_phrase() -> str:
  """The devices a run uses, for a console line: ``"8 cpu devices, 1 process"``."""
  s = device_summary()
  n, p = s["num_devices"], s["process_count"]
  return (f"{n} {s['device_kind']} device{'s' if n != 1 else ''}, {p} "
          f"process{'es' if p != 1 else ''}")
