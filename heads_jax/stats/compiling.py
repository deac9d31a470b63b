"""Compiling the analysis programs a bounded number of times, ahead of the batches that need them.

An accelerator compiles BERT-base's analysis program in about 9 s per batch shape (H200, issue 35);
a pass that met eight length buckets one after the other spent most of its time compiling. Here:

* ``pass_lengths(max_length, step)``: the padded lengths of a pass, at most ``MAX_SHAPES_PER_PASS``
  (3): multiples of ``step`` at about a quarter and a half of ``max_length``, and ``max_length``
  (32, 64, 128 for 128 positions). Both passes of an analysis use them (``fit_length`` pads an
  encoded batch ``[b, k]`` up to the next one), so with a fixed batch size a pass has at most
  three shapes and the second (norm-weighted) pass compiles the same ones.
* ``batch_rows(batch_size, max_length)``: the rows of a pass's batches from a token budget,
  ``batch_size`` sequences of ``BUDGET_LENGTH`` (128) positions: ``batch_size`` rows up to 128
  positions, proportionally fewer past it (at least one), so the default batch size holds any
  length (one 8,192-position sequence a step) and a step's memory grows with its tokens, not
  with the longest sequence times a fixed count.
* ``executable(program, key, lower, background=)``: the compiled program for one signature
  ``key`` (program and batch shape), compiled once per process by ``lower().compile()``, in the
  foreground or on one background compile thread; a ``concurrent.futures.Future``. Every call of
  a step goes through it, so a shape is never compiled twice (JAX's persistent compilation cache,
  which ``heads-jax`` turns on, still serves a second process).
* ``ahead(batches, on_shape)``: iterates an encoded-batch stream in a background thread, some
  batches ahead of its consumer, and calls ``on_shape(rows, length)`` the first time a shape
  comes: there the steps start that shape's compilation, which then overlaps the host's
  encoding (tokenizer, parser) and the device's work on the earlier shapes.

``PROGRAM_NAMES`` are the names the jitted analysis programs carry in JAX's compile events
(``jax.monitoring``, ``/jax/core/compile/backend_compile_duration`` with ``fun_name``), which
the compile-count test counts.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import queue
import threading
from typing import Callable, Iterable, Iterator

import numpy as np

from heads_jax.data import prefetch
from heads_jax.data.vocabulary import empty_batch

MAX_SHAPES_PER_PASS = 3
PROGRAM_NAMES = ("analysis_pass", "norm_pass")   # the analysis step's and the second pass's

_LOCK = threading.Lock()
_EXECUTABLES: dict = {}           # (id(program), key) -> (program, Future of a jax Compiled)
_QUEUE: queue.PriorityQueue = queue.PriorityQueue()   # (priority, order, build) for the compiler
_ORDER = itertools.count()
_COMPILER: list = []              # the background compile thread, started on first use
_START = threading.Lock()


_STOP = threading.Event()         # set at interpreter exit: queued compilations are dropped


def _compile_loop():
  while True:
    _, _, build = _QUEUE.get()
    if _STOP.is_set() or build is None:
      return
    build()


def _stop_compiling(timeout: float = 300.0) -> None:
  """At interpreter exit: drop the queued compilations and wait for the one under way. A daemon
  thread still inside XLA when Python finalises is unwound by force, which XLA's C++ turns into
  "FATAL: exception not rethrown" (e.g. after a run stopped on an error while the second pass's
  programs were still queued)."""
  _STOP.set()
  if _COMPILER:
    _QUEUE.put((float("-inf"), -1, None))
    _COMPILER[0].join(timeout)


def _in_background(build, priority: int) -> None:
  with _START:
    if not _COMPILER:
      thread = threading.Thread(target=_compile_loop, name="heads_jax-compile", daemon=True)
      thread.start()
      _COMPILER.append(thread)
      atexit.register(_stop_compiling)
  _QUEUE.put((priority, next(_ORDER), build))


BUDGET_LENGTH = 128


def batch_rows(batch_size: int, max_length: int) -> int:
  """Rows per batch of a pass of ``max_length`` positions under the token budget of
  ``batch_size`` sequences of ``BUDGET_LENGTH`` positions (module docstring): ``batch_size`` up
  to 128 positions, ``batch_size * 128 // max_length`` past it, at least 1."""
  return max(1, min(int(batch_size), int(batch_size) * BUDGET_LENGTH // int(max_length)))


def pass_lengths(max_length: int, step: int = 16) -> tuple[int, ...]:
  """The padded lengths of a pass: at most ``MAX_SHAPES_PER_PASS``, each a multiple of ``step``
  (or ``max_length``): the smallest multiples of ``step`` holding a quarter and a half of
  ``max_length``, and ``max_length`` itself. ``pass_lengths(128) == (32, 64, 128)``,
  ``pass_lengths(512) == (128, 256, 512)``, ``pass_lengths(48, 48) == (48,)``."""
  if step <= 0:
    raise ValueError(f"bucket step must be positive, got {step}")
  if max_length < 1:
    raise ValueError(f"max_length must be positive, got {max_length}")
  out = {int(max_length)}
  for share in (4, 2):
    k = -(-max_length // share)
    out.add(min(int(max_length), -(-k // step) * step))
  return tuple(sorted(out))


def fit_length(batch: dict, lengths) -> dict:
  """``batch`` (``[b, k]`` per field) padded to the smallest of ``lengths`` >= k with the padding
  of ``heads_jax.data.vocabulary.empty_batch`` (what ``encoding.collate`` pads with); returned
  unchanged when k is one of them. Raises ValueError if k exceeds them all."""
  b, k = np.asarray(batch["input_ids"]).shape
  target = next((int(n) for n in sorted(lengths) if n >= k), None)
  if target is None:
    raise ValueError(f"a batch of length {k} is longer than the pass's lengths {tuple(lengths)}")
  if target == k:
    return batch
  pad = empty_batch(b, target - k)
  return {f: (np.concatenate([np.asarray(batch[f]), pad[f].astype(np.asarray(batch[f]).dtype)], 1)
              if f in pad else batch[f]) for f in batch}


def executable(program, key, lower: Callable, background: bool = False, priority: int = 0):
  """The Future of ``program``'s executable for ``key`` (hashable: what fixes the argument
  shapes, shardings and structure), made once per process by ``lower().compile()``: on the
  background compile thread with ``background`` (lower ``priority`` first: the first pass's
  programs before the second's), else in the caller. A compilation already under way or done is
  shared; one still queued is taken over by a caller that needs it now."""
  with _LOCK:
    entry = _EXECUTABLES.get((id(program), key))
    if entry is None:
      future, claim = concurrent.futures.Future(), threading.Lock()

      def build():
        if not claim.acquire(blocking=False):
          return  # built (or being built) by the other of queue and caller
        try:
          future.set_result(lower().compile())
        except BaseException as e:  # noqa: BLE001  (handed to whoever waits on it)
          with _LOCK:  # a later call tries again (and raises again) instead of keeping the error
            _EXECUTABLES.pop((id(program), key), None)
          future.set_exception(e)

      entry = _EXECUTABLES[(id(program), key)] = (program, future, build)
      if background:
        _in_background(build, priority)
        return future
  if not background:
    entry[2]()  # builds it here unless the compile thread has it (then waits on the future)
  return entry[1]


def signature(tree) -> tuple:
  """A hashable signature of a pytree of arrays: structure, shapes, dtypes and shardings."""
  import jax
  leaves, treedef = jax.tree.flatten(tree)
  return (treedef,) + tuple((tuple(x.shape), str(x.dtype), getattr(x, "sharding", None))
                            for x in leaves)


def ahead(batches: Iterable, on_shape: Callable[[int, int], None] | None = None,
          depth: int = 64, prepare: Callable | None = None) -> Iterator:
  """Yields the items of ``batches`` (``(indices, batch)``) as they come, produced by a
  background thread up to ``depth`` items ahead (``heads_jax.data.prefetch.in_background``);
  ``on_shape(rows, length)`` is called in that thread the first time a batch ``[rows, length]``
  comes, and ``prepare(indices, batch) -> batch`` (e.g. ``AnalysisStep.with_tables``: what the
  host builds of each batch for the device) on every batch. An error of the stream (or of
  ``on_shape``, ``prepare``) is raised here; closing the generator stops the thread."""
  def shaped():
    seen = set()
    for item in batches:
      shape = np.asarray(item[1]["input_ids"]).shape
      if on_shape is not None and shape not in seen:
        seen.add(shape)
        on_shape(*shape)
      yield item if prepare is None else (item[0], prepare(*item))

  return prefetch.in_background(shaped(), depth, name="heads_jax-encode", join_s=5)


def pass_batches(batches: Iterable, lengths, steps=(), later=(), depth: int = 64,
                 prepare: Callable | None = None) -> Iterator:
  """The batches of a pass, each padded to one of the pass's ``lengths`` (``fit_length``),
  produced ``ahead`` (with ``prepare``); the first batch of each shape starts that shape's
  compilation for every step of ``steps`` (``step.precompile(rows, length)``) and, behind them,
  of ``later`` (a second pass over the same shapes)."""
  def on_shape(rows, length):
    for step in steps:
      step.precompile(rows, length)
    for step in later:
      step.precompile(rows, length, priority=1)

  return ahead(((i, fit_length(b, lengths)) for i, b in batches), on_shape, depth, prepare)


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileLog:
  """The XLA compilations of this process while it is open (``with CompileLog() as log``), from
  JAX's compile events (``jax.monitoring``): ``log.names`` (the jitted functions' names, one per
  compilation; a persistent-cache hit counts too), ``log.seconds``, ``log.count(*names)``."""

  def __init__(self):
    self.names: list[str] = []
    self.seconds: list[float] = []
    self._lock = threading.Lock()

  def _listen(self, event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
      with self._lock:
        name = str(kwargs.get("fun_name", ""))
        if name.startswith("jit(") and name.endswith(")"):
          name = name[4:-1]
        self.names.append(name)
        self.seconds.append(float(duration))

  def count(self, *names: str) -> int:
    """Compilations of functions named ``names`` (default: the analysis programs)."""
    names = names or PROGRAM_NAMES
    return sum(n in names for n in self.names)

  def __enter__(self) -> "CompileLog":
    import jax
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc) -> None:
    import jax
    jax.monitoring.unregister_event_duration_listener(self._listen)
