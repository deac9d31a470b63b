"""Batches built ahead of the training step: ``prefetch(batch_fn, start_step, ...)``.

``batch_fn(step)`` must be a pure function of the step number (every data stream here is), so
the order and the contents of the batches are the same whichever way they are built: in one
background thread (``num_workers=0``), or in ``num_workers`` spawned processes, to which
``batch_fn`` is pickled once each (e.g. ``functools.partial`` of a bound method of an object
that pickles: the tokenizer and the corpus of ``PretrainingExamples`` do). ``num_workers < 0``
(``AUTO``) picks the count from the host's cores (``auto_workers``).

The stream (``BatchStream``) measures itself: the seconds each batch took to build (where it was
built) and the seconds its consumer waited for one. ``take_stats`` returns them since the last
call, with the pipeline's capacity (workers / seconds per batch): the training loop logs them and
says when the input starves the device.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Callable, Iterable, Iterator

AUTO = -1
_WORKER_FN = None


def available_cores() -> int:
  """Cores this process may run on (its affinity mask)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def auto_workers(cores: int | None = None, *, reserve: int = 2, cap: int = 32) -> int:
  """Worker processes for ``cores`` (default: this process's): all but ``reserve`` (the training
  loop and the runtime's own threads), at most ``cap``; 0 (one background thread) on a host with
  ``reserve`` cores or fewer. One BERT batch of 256 x 128 takes about 0.28 CPU-s to build, so a
  step of 35-45 ms needs 7-8 workers: a 16-core GPU host gets 14."""
  cores = available_cores() if cores is None else int(cores)
  return max(0, min(cap, cores - reserve))


def resolve_workers(num_workers: int) -> int:
  """``num_workers``, or ``auto_workers()`` when it is negative."""
  return auto_workers() if num_workers < 0 else int(num_workers)


def _worker_init(batch_fn):
  global _WORKER_FN
  _WORKER_FN = batch_fn


def _timed(fn, step: int):
  t = time.perf_counter()
  batch = fn(step)
  return batch, time.perf_counter() - t


def _worker_batch(step: int):
  return _timed(_WORKER_FN, step)


class BatchStream:
  """An iterator of batches (``prefetch``'s result) that measures the input pipeline."""

  def __init__(self, timed: Iterator, workers: int):
    self._timed = timed
    self.workers = workers
    self._build = 0.0
    self._waited = 0.0
    self._count = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    t = time.perf_counter()
    batch, build_s = next(self._timed)
    self._waited += time.perf_counter() - t
    self._build += build_s
    self._count += 1
    return batch

  def close(self) -> None:
    close = getattr(self._timed, "close", None)
    if close is not None:
      close()

  def take_stats(self) -> dict:
    """Since the last call: ``batches``, ``batch_build_s`` (mean seconds to build one where it
    was built), ``input_capacity_per_s`` (batches per second the workers can make: workers /
    ``batch_build_s``), ``input_wait_s`` (seconds the consumer waited, in all); resets."""
    n = self._count
    out = {"batches": n, "input_wait_s": self._waited}
    if n:
      build = self._build / n
      out["batch_build_s"] = build
      if build > 0:
        out["input_capacity_per_s"] = max(1, self.workers) / build
    self._build = self._waited = 0.0
    self._count = 0
    return out


def prefetch(batch_fn: Callable[[int], dict], start_step: int, *, num_steps: int | None = None,
             depth: int = 2, num_workers: int = 0) -> BatchStream:
  """Yields ``batch_fn(start_step), batch_fn(start_step + 1), ...`` (endless unless
  ``num_steps``), keeping up to ``depth`` batches (at least the workers') under way. An
  exception raised while building a batch is raised here, in the consumer. ``num_workers``:
  processes (0: one background thread; negative: ``auto_workers()``)."""
  stop = None if num_steps is None else start_step + num_steps
  workers = resolve_workers(num_workers)
  if workers > 0:
    return BatchStream(_from_processes(batch_fn, start_step, stop, depth, workers), workers)
  return BatchStream(_from_thread(batch_fn, start_step, stop, depth), 0)


def _from_processes(batch_fn, start_step, stop, depth, num_workers):
  pool = cf.ProcessPoolExecutor(num_workers, mp_context=mp.get_context("spawn"),
                                initializer=_worker_init, initargs=(batch_fn,))
  try:
    pending = []
    step = start_step
    while stop is None or step < stop or pending:
      while len(pending) < max(depth, num_workers) and (stop is None or step < stop):
        pending.append(pool.submit(_worker_batch, step))
        step += 1
      yield pending.pop(0).result()
  finally:
    pool.shutdown(wait=False, cancel_futures=True)


def _from_thread(batch_fn, start_step, stop, depth):
  steps = itertools.count(start_step) if stop is None else range(start_step, stop)
  return in_background((_timed(batch_fn, step) for step in steps), depth)


_DONE = object()


def in_background(items: Iterable, depth: int, *, name: str = "heads_jax-prefetch",
                  join_s: float = 0.0) -> Iterator:
  """Yields the items of ``items`` as a daemon thread takes them, up to ``depth`` ahead (the
  thread runs the iterator: a generator's work happens there). An exception of the iterator is
  raised here, in the consumer. Closing the generator stops the thread before its next item
  (waiting up to ``join_s`` seconds for it)."""
  q: queue.Queue = queue.Queue(maxsize=max(1, depth))
  stop = threading.Event()

  def put(entry) -> bool:
    while not stop.is_set():
      try:
        q.put(entry, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce():
    it = iter(items)
    try:
      while not stop.is_set():
        item = next(it, _DONE)
        if not put((None, item)) or item is _DONE:
          return
    except BaseException as e:  # noqa: BLE001  (raised in the consumer)
      put((e, None))

  thread = threading.Thread(target=produce, name=name, daemon=True)
  thread.start()
  try:
    while True:
      error, item = q.get()
      if error is not None:
        raise error
      if item is _DONE:
        return
      yield item
  finally:
    stop.set()
    if join_s:
      thread.join(timeout=join_s)
