"""heads_jax.data.prefetch: batches built ahead in a background thread, in order, errors raised in
the consumer, the thread stopped on close."""

import itertools
import threading
import time

import pytest

from heads_jax.data import prefetch as pf


def test_in_background_keeps_the_order_and_runs_the_iterator_in_its_thread():
  where = []

  def items():
    for i in range(5):
      where.append(threading.current_thread().name)
      yield i * i

  assert list(pf.in_background(items(), depth=2, name="t-bg")) == [0, 1, 4, 9, 16]
  assert set(where) == {"t-bg"}


def test_in_background_raises_the_producers_error_in_the_consumer():
  def items():
    yield 1
    raise KeyError("broken batch")

  got = pf.in_background(items(), depth=1)
  assert next(got) == 1
  with pytest.raises(KeyError, match="broken batch"):
    next(got)


def test_closing_stops_the_thread_before_its_next_item():
  taken = []

  def items():
    for i in itertools.count():
      taken.append(i)
      yield i

  got = pf.in_background(items(), depth=1, join_s=5)
  assert next(got) == 0
  got.close()
  time.sleep(0.3)
  n = len(taken)
  time.sleep(0.3)
  assert len(taken) == n <= 3  # the one handed over, the one queued, at most one blocked in put


def test_prefetch_in_one_thread_yields_the_steps_in_order():
  stream = pf.prefetch(lambda step: {"step": step}, 3, num_steps=4, depth=2)
  assert [b["step"] for b in stream] == [3, 4, 5, 6]
