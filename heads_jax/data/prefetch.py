"""Batches built ahead of the training step: ``prefetch(batch_fn, start_step, ...)``.

``batch_fn(step)`` must be a pure function of the step number (every data stream here is), so
the order and the contents of the batches are the same whichever way they are built: in one
background thread (``num_workers=0``), or in ``num_workers`` spawned processes, to which
``batch_fn`` is pickled once each (e.g. ``functools.partial`` of a bound method of an object
that pickles: the tokenizer and the corpus of ``PretrainingExamples`` do).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import queue
import threading
from typing import Callable, Iterator

_WORKER_FN = None


def _worker_init(batch_fn):
  global _WORKER_FN
  _WORKER_FN = batch_fn


def _worker_batch(step: int):
  return _WORKER_FN(step)


def prefetch(batch_fn: Callable[[int], dict], start_step: int, *, num_steps: int | None = None,
             depth: int = 2, num_workers: int = 0) -> Iterator[dict]:
  """Yields ``batch_fn(start_step), batch_fn(start_step + 1), ...`` (endless unless
  ``num_steps``), keeping up to ``depth`` batches (at least ``num_workers``) under way. An
  exception raised while building a batch is raised here, in the consumer."""
  stop = None if num_steps is None else start_step + num_steps
  if num_workers > 0:
    return _from_processes(batch_fn, start_step, stop, depth, num_workers)
  return _from_thread(batch_fn, start_step, stop, depth)


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
  q: queue.Queue = queue.Queue(maxsize=max(1, depth))
  done = threading.Event()

  def put(item) -> bool:
    while not done.is_set():
      try:
        q.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce():
    step = start_step
    try:
      while not done.is_set() and (stop is None or step < stop):
        if not put(batch_fn(step)):
          return
        step += 1
      put(None)
    except BaseException as e:  # surfaced in the consumer
      put(e)

  thread = threading.Thread(target=produce, daemon=True)
  thread.start()
  try:
    while True:
      item = q.get()
      if item is None:
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    done.set()
