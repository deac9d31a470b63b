"""Pre-emption and interruption of a training run (issue 34): SIGTERM or Ctrl-C landing in any
phase of a step (the device step, logging, evaluation, a save in flight) is answered with a
checkpoint of that very step; Ctrl-C prints one line; a failed asynchronous save stops the run
before the next step with one line naming the checkpoint, nothing after it."""

from __future__ import annotations

import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.parallel import data_mesh
from heads_jax.training import checkpointing, loop
from tests.training import fake_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, phase: str, at: int, signum: int, *, every: int = 2):
  """Runs a fake 8-step loop (no model) whose phase ``phase`` of step ``at`` sends ``signum``
  to this process; returns ``(steps run, saved steps, flag)``."""
  ckpts = checkpointing.Checkpoints(tmp_path / "checkpoints", save_interval_steps=every,
                                    max_to_keep=None)
  ran = []

  def kill(where, step):
    if where == phase and step == at:
      os.kill(os.getpid(), signum)

  def train_step(state, batch):
    k = int(state["step"]) + 1
    ran.append(k)
    kill("step", k)
    return ({"step": np.int32(k), "params": {"w": state["params"]["w"] + 1}},
            {"loss": np.float32(1.0 / k), "grad_norm": np.float32(1.0)})

  def print_fn(line):  # the progress line "step K/8 | ..." (the logging of step K)
    if line.startswith("step "):
      kill("log", int(line.split()[1].split("/")[0]))

  def eval_fn(state, step):
    kill("eval", step)
    return {"accuracy": 1.0}

  real_save = ckpts.manager.save

  def save(step, *args, **kwargs):  # the signal arrives while Orbax writes the step
    out = real_save(step, *args, **kwargs)
    kill("save", step)
    return out

  ckpts.manager.save = save
  flag = loop.StopFlag()
  state = {"step": np.int32(0), "params": {"w": np.zeros((64, 64), np.float32)}}
  batches = iter(lambda: {"x": np.zeros(8, np.float32)}, None)
  try:
    state, _ = loop.train_loop(state=state, train_step=train_step, batches=batches,
                               mesh=data_mesh(), start_step=0, total_steps=8, ckpts=ckpts,
                               writer=None, throughput=None, log_every=3, eval_every=3,
                               eval_fn=eval_fn, print_fn=print_fn, stop_flag=flag)
  finally:
    ckpts.close()
  return ran, ckpts.all_steps(), flag, int(state["step"])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("phase,at", [("step", 3), ("log", 3), ("eval", 3), ("save", 4)])
def test_a_signal_in_any_phase_of_a_step_saves_that_step(tmp_path, phase, at, signum):
  ran, saved, flag, done = _run(tmp_path, phase, at, signum)
  assert flag.stop and flag.signal == signal.Signals(signum).name
  assert ran == list(range(1, at + 1)), "the run went on after the signal"
  assert done == at
  assert saved == sorted({2, at}), f"no checkpoint of step {at}"
  like = {"step": jnp.int32(0), "params": {"w": jnp.zeros((64, 64), jnp.float32)}}
  restored, _ = checkpointing.Checkpoints(tmp_path / "checkpoints").restore(
      checkpointing.abstract_like(like))
  assert int(restored["step"]) == at and float(restored["params"]["w"][0, 0]) == at


def test_signal_handlers_are_restored_and_a_second_ctrl_c_stops_at_once():
  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  flag = loop.StopFlag()
  with flag:
    with flag:  # re-entrant: the job holds it, the loop enters it again
      os.kill(os.getpid(), signal.SIGINT)
      assert flag.stop and flag.signal == "SIGINT"
    assert signal.getsignal(signal.SIGINT) == flag._handle
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_prints_one_line(tmp_path):
  p, lines, steps, ran = fake_run.launch("sigint", tmp_path / "run")
  assert p.returncode == 130, p.stderr[-2000:]
  assert ran == [1, 2, 3] and steps == [2, 3]
  assert lines == [f"heads-jax: interrupted (Ctrl-C) after saving; the last complete checkpoint "
                   f"is step 3 in {tmp_path / 'run' / 'checkpoints'}; run the same command again "
                   f"to resume"]


@pytest.mark.slow
@pytest.mark.parametrize("mode,why", [
    ("asyncnospace", "no space left on the device of {run} while writing the checkpoint of step 4 "
                     "({ck}/4) ([Errno 28] No space left on device); the last complete checkpoint "
                     "is step 2 in {ck} (intact; removed the partial save 4.orbax-checkpoint-tmp); "
                     "free some space and run the same command again"),
    ("asyncdenied", "the checkpoint of step 4 could not be written to {ck}/4 (PermissionError: "
                    "[Errno 13] Permission denied: '{ck}/4.orbax-checkpoint-tmp/"
                    "meta.orbax-checkpoint-tmp'); the last complete checkpoint is step 2 in {ck} "
                    "(intact; removed the partial save 4.orbax-checkpoint-tmp); check that the "
                    "storage is writable and has space, then run the same command again"),
])
def test_a_failed_async_save_stops_at_once_with_one_line(tmp_path, mode, why):
  run = tmp_path / "run"
  p, lines, steps, ran = fake_run.launch(mode, run)
  assert p.returncode == 2, p.stderr[-3000:]
  # noticed at the first step boundary after the failure: before step 5 or, when the background
  # write fails while step 5 runs, before step 6 (step 5 waits for it: never later)
  assert ran in ([1, 2, 3, 4], [1, 2, 3, 4, 5]), f"training went on past the failed save: {ran}"
  assert steps == [2]
  assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["2"]
  assert lines == ["heads-jax fake: error: " + why.format(run=run, ck=run / "checkpoints")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_stops_a_long_evaluation_within_seconds(tmp_path, signum):
  """The first signal waits for the step's host work; a second one (Ctrl-C or SIGTERM) during a
  long evaluation stops at once, the last checkpoint intact."""
  import time
  ckpts = checkpointing.Checkpoints(tmp_path / "checkpoints", save_interval_steps=2)

  def train_step(state, batch):
    k = int(state["step"]) + 1
    return ({"step": np.int32(k), "params": {"w": state["params"]["w"] + 1}},
            {"loss": np.float32(1.0), "grad_norm": np.float32(1.0)})

  def eval_fn(state, step):
    os.kill(os.getpid(), signum)
    os.kill(os.getpid(), signum)
    time.sleep(60)   # a long evaluation the second signal cuts short
    return {}

  flag = loop.StopFlag()
  state = {"step": np.int32(0), "params": {"w": np.zeros((4,), np.float32)}}
  t0 = time.perf_counter()
  with pytest.raises(KeyboardInterrupt):
    loop.train_loop(state=state, train_step=train_step, batches=iter(lambda: {"x": np.zeros(8)}, None),
                    mesh=data_mesh(), start_step=0, total_steps=8, ckpts=ckpts, writer=None,
                    throughput=None, log_every=1, eval_every=3, eval_fn=eval_fn, print_fn=None,
                    stop_flag=flag)
  ckpts.close()
  assert time.perf_counter() - t0 < 30
  assert flag.second == signal.Signals(signum).name and ckpts.all_steps() == [2]
