"""``compiling.ahead``: the batches of a pass produced on a background thread, each new shape
announced once (where the step's compilation starts), the stream's error raised in the consumer."""

import threading

import numpy as np
import pytest

from heads_jax.stats import compiling


def _batch(rows, length):
  return {"input_ids": np.zeros((rows, length), np.int32)}


def test_ahead_yields_in_order_and_announces_each_shape_once_in_its_thread():
  shapes = [(4, 16), (4, 16), (2, 32), (4, 16), (2, 32)]
  seen, threads = [], set()

  def on_shape(rows, length):
    seen.append((rows, length))
    threads.add(threading.current_thread().name)

  got = list(compiling.ahead(((i, _batch(*s)) for i, s in enumerate(shapes)), on_shape, depth=2))
  assert [i for i, _ in got] == list(range(len(shapes)))
  assert seen == [(4, 16), (2, 32)]
  assert threads == {"heads_jax-encode"}


def test_ahead_raises_the_streams_error_in_the_consumer():
  def stream():
    yield 0, _batch(1, 8)
    raise ValueError("bad line 2")

  it = compiling.ahead(stream())
  assert next(it)[0] == 0
  with pytest.raises(ValueError, match="bad line 2"):
    next(it)


def test_batch_rows_keep_a_token_budget():
  """``batch_size`` rows up to 128 positions, the same tokens past it, at least one row."""
  from heads_jax.stats.compiling import batch_rows
  assert [batch_rows(32, n) for n in (16, 128, 256, 512, 4096, 8192)] == [32, 32, 16, 8, 1, 1]
  assert batch_rows(1, 512) == 1 and batch_rows(64, 1000) == 8
