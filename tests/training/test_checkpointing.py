"""heads_jax.training.checkpointing: a damaged newest step is set aside with one line and the
previous complete step restored; saved parameters of another shape (another model size, on a
resume or as an init checkpoint) are one UserError line, not Orbax's tree mismatch."""

from __future__ import annotations

import glob
import os
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.errors import UserError
from heads_jax.training import checkpointing


def _state(rows=64, value=0.0):
  return {"step": jnp.int32(0),
          "params": {"bert": {"w": jnp.full((rows, 16), value)}, "head": jnp.full(3, value)},
          "opt_state": (jnp.full(2, value),)}


def _saved_run(directory, steps=(1, 2)):
  ckpts = checkpointing.Checkpoints(directory, save_interval_steps=1, max_to_keep=None)
  for s in steps:
    ckpts.save(s, dict(_state(value=float(s)), step=jnp.int32(s)), {"step": s})
  ckpts.close()
  return directory


def _damage(step_dir, how):
  if how == "metadata":
    os.remove(os.path.join(step_dir, "state", "_METADATA"))
    return
  data = sorted(f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True)
                if os.path.isfile(f) and f"{os.sep}d{os.sep}" in f)
  assert data, "no data files found in the step folder"
  if how == "deleted":
    os.remove(data[0])
  else:
    with open(data[0], "r+b") as f:
      f.truncate(10)


@pytest.mark.parametrize("how", ["deleted", "truncated", "metadata"])
def test_damaged_newest_step_is_set_aside_and_the_previous_restored(tmp_path, how):
  run = _saved_run(tmp_path / "run" / "checkpoints")
  _damage(str(run / "2"), how)
  lines = []
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1, max_to_keep=None)
  state, meta = ckpts.restore(checkpointing.abstract_like(_state()), log=lines.append)
  assert meta == {"step": 1} and int(state["step"]) == 1
  np.testing.assert_array_equal(np.asarray(state["params"]["head"]), [1.0, 1.0, 1.0])
  assert len(lines) == 1
  assert lines[0].startswith(f"checkpoint step 2 in {run} is damaged (")
  assert lines[0].endswith(f"moved it to {tmp_path / 'run' / 'damaged_checkpoints' / '2'}; "
                           f"restoring step 1")
  # nothing is lost: the damaged step is beside the run, out of its way
  assert (tmp_path / "run" / "damaged_checkpoints" / "2").is_dir()
  assert ckpts.all_steps() == [1]
  # the run goes on: step 2 can be saved again
  ckpts.save(2, dict(_state(value=5.0), step=jnp.int32(2)), {"step": 2}, force=True)
  ckpts.close()
  again = checkpointing.Checkpoints(run, save_interval_steps=1)
  state, meta = again.restore(checkpointing.abstract_like(_state()), log=lines.append)
  assert meta == {"step": 2} and len(lines) == 1
  again.close()


def test_every_step_damaged_is_file_not_found(tmp_path):
  run = _saved_run(tmp_path / "ck", steps=(1,))
  _damage(str(run / "1"), "deleted")
  lines = []
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1)
  with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
    ckpts.restore(checkpointing.abstract_like(_state()), log=lines.append)
  assert len(lines) == 1 and lines[0].endswith("no earlier checkpoint: starting afresh")
  ckpts.close()


def test_resume_with_another_model_size_is_one_line(tmp_path):
  run = _saved_run(tmp_path / "ck")
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1)
  with pytest.raises(UserError) as e:
    ckpts.restore(checkpointing.abstract_like(_state(rows=32)))
  text = str(e.value)
  assert "\n" not in text and len(text) < 400
  assert text.startswith(f"{run / '2'} holds a model of another shape than this run's "
                         f"(bert/w is [64, 16] there, [32, 16] here)")
  assert ckpts.all_steps() == [1, 2]  # nothing set aside: the checkpoints are fine
  ckpts.close()


def test_init_from_a_run_of_another_model_size_is_one_line(tmp_path):
  run = _saved_run(tmp_path / "ck")
  target = checkpointing.abstract_like({"bert": _state(rows=48)["params"]["bert"]})
  with pytest.raises(UserError) as e:
    checkpointing.restore_params_from_run(run, target)
  text = str(e.value)
  assert "\n" not in text and "strict" not in text
  assert text.startswith(f"init_checkpoint {run / '2'} holds a model of another shape than this "
                         f"run's (bert/w is [64, 16] there, [48, 16] here)")
  assert "--config.model.size" in text
  # the same size restores (a subtree: the encoder only)
  ok = checkpointing.abstract_like({"bert": _state()["params"]["bert"]})
  params, step = checkpointing.restore_params_from_run(run, ok)
  assert step == 2 and float(params["bert"]["w"][0, 0]) == 2.0


def test_restore_params_for_trajectory(tmp_path):
  """``what`` names the checkpoint, ``step`` picks one, ``only_saved`` drops what it lacks, and a
  damaged step is a ``DamagedCheckpoint`` (the manager closed either way)."""
  run = _saved_run(tmp_path / "ck")
  want = checkpointing.abstract_like({"bert": _state()["params"]["bert"],
                                      "pooler": {"w": jnp.zeros(4)}})
  with pytest.raises(UserError, match="it has no pooler/w.*set --config.model.size"):
    checkpointing.restore_params_from_run(run, want, 1)
  with pytest.raises(UserError, match=r"it has no pooler/w\): --run must be"):
    checkpointing.restore_params_from_run(run, want, 1, advice="--run must be a training run")
  params, step = checkpointing.restore_params_from_run(run, want, 1, only_saved=True,
                                                       what="the checkpoint of step 1")
  assert step == 1 and set(params) == {"bert"} and float(params["bert"]["w"][0, 0]) == 1.0
  _damage(str(run / "2"), "metadata")
  with pytest.raises(checkpointing.DamagedCheckpoint, match=r"^the checkpoint of step 2 .* cannot be read"):
    checkpointing.restore_params_from_run(run, want, 2, only_saved=True,
                                          what="the checkpoint of step 2")
  _damage(str(run / "1"), "truncated")
  with pytest.raises(checkpointing.DamagedCheckpoint, match="cannot be (read|restored)") as info:
    checkpointing.restore_params_from_run(run, want, 1, only_saved=True,
                                          advice="--run must be a training run")
  # the reason in plain words (a cut data file: TensorStore's OUT_OF_RANGE or DATA_LOSS), and
  # the caller's advice in place of the default
  assert info.value.reason and info.value.reason in str(info.value)
  assert str(info.value).endswith("; --run must be a training run")
  assert "another step's folder" not in str(info.value)
  assert issubclass(checkpointing.DamagedCheckpoint, UserError)


def test_first_line_words_tensorstore_codes():
  first = checkpointing._first_line
  assert first(ValueError("OUT_OF_RANGE: Error reading x\nmore")) == \
      "a data file is shorter than its index says (truncated): OUT_OF_RANGE"
  assert first(OSError("DATA_LOSS: bad")) == "a data file is corrupt: DATA_LOSS"
  assert first(OSError("NOT_FOUND: gone")) == "a file is missing: NOT_FOUND"
  assert first(KeyError("other")) == "KeyError: 'other'"


def test_remove_partial_leaves_complete_checkpoints(tmp_path):
  run = _saved_run(tmp_path / "ck", steps=(1,))
  (run / "2.orbax-checkpoint-tmp-17").mkdir()
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1)
  assert ckpts.remove_partial() == ["2.orbax-checkpoint-tmp-17"]
  assert sorted(p.name for p in run.iterdir()) == ["1"]
  ckpts.close()


def test_note_names_the_last_complete_checkpoint(tmp_path):
  ckpts = checkpointing.Checkpoints(tmp_path / "ck", save_interval_steps=1)
  assert ckpts.note() == f"no checkpoint in {tmp_path / 'ck'} is complete yet"
  ckpts.save(1, _state(), {})
  ckpts.save(2, _state(), {})  # Orbax finished step 1 before it started step 2
  assert ckpts.complete == 1 and ckpts.pending == 2
  ckpts.wait()
  assert ckpts.note() == f"the last complete checkpoint is step 2 in {tmp_path / 'ck'}"
  ckpts.close()


def test_open_checkpoints_drop_only_the_closed_event_loop_unraisable(tmp_path, monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)

  def info(exc):
    return types.SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                                 err_msg=None, object=None)

  ckpts = checkpointing.Checkpoints(tmp_path / "ck", async_save=False)
  try:
    sys.unraisablehook(info(RuntimeError("Event loop is closed")))
    other = info(ValueError("something else"))
    sys.unraisablehook(other)
    assert seen == [other]
  finally:
    ckpts.close()
  assert sys.unraisablehook == seen.append            # the previous hook is back


def test_a_callers_error_is_raised_and_sets_no_step_aside(tmp_path):
  """A target Orbax cannot restore into is the caller's bug, not damage: raised as it is, and the
  checkpoints stay where they are."""
  run = _saved_run(tmp_path / "ck")
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1, max_to_keep=None)
  try:
    bad = checkpointing.abstract_like(_state())
    bad["step"] = np.int32(0)                          # not an array Orbax restores into
    with pytest.raises(ValueError, match="Unsupported type") as info:
      ckpts.restore(bad, log=pytest.fail)
    assert not checkpointing.is_damage(info.value)
    assert ckpts.all_steps() == [1, 2]
  finally:
    ckpts.close()
  assert not (tmp_path / "damaged_checkpoints").exists()
  assert checkpointing.is_damage(ValueError("OUT_OF_RANGE: Error reading x"))
  assert checkpointing.is_damage(FileNotFoundError("x"))
  assert not checkpointing.is_damage(ValueError("Unsupported type numpy.int32"))


def test_where_a_folder_cannot_be_renamed_a_damaged_step_is_copied_aside(tmp_path, monkeypatch):
  """A bucket cannot rename a folder: the damaged step's files are copied to
  damaged_checkpoints/ before the step is deleted (nothing written is lost)."""
  run = _saved_run(tmp_path / "run" / "checkpoints")
  _damage(str(run / "2"), "truncated")
  files = sorted(str(p.relative_to(run / "2")) for p in (run / "2").rglob("*") if p.is_file())

  def no_rename(src, dest):
    raise OSError("rename is not supported")

  monkeypatch.setattr(checkpointing, "_rename", no_rename)
  lines = []
  ckpts = checkpointing.Checkpoints(run, save_interval_steps=1, max_to_keep=None)
  try:
    state, meta = ckpts.restore(checkpointing.abstract_like(_state()), log=lines.append)
    assert meta == {"step": 1} and ckpts.all_steps() == [1]
  finally:
    ckpts.close()
  aside = tmp_path / "run" / "damaged_checkpoints" / "2"
  assert sorted(str(p.relative_to(aside)) for p in aside.rglob("*") if p.is_file()) == files
  assert f"moved it to {aside}" in lines[0]


@pytest.mark.parametrize("kind", ["finalize", "signaling"])
def test_joining_a_failed_saves_threads_does_not_raise_their_error_again(kind):
  """Orbax's save threads re-raise their error from ``join``: a second thread of a failed save
  still running when ``_failed`` joins them (a loaded machine: CI 2026-11-29) must not raise it
  again out of the handler that makes it one ``SaveFailed`` line (it became a traceback, exit 1)."""
  import threading
  import time
  from orbax.checkpoint import checkpoint_manager
  from orbax.checkpoint._src.futures import future

  def refused():
    time.sleep(0.3)
    raise OSError("Forbidden: step 4's metadata")

  if kind == "finalize":
    t = checkpoint_manager._FinalizeThread(4, refused, name="save_finalize")
  else:
    t = future._SignalingThread(target=refused, send_signals=[], receive_signals=[],
                                timeout_secs=60, name="save_signaling")
  t.start()
  assert t.is_alive()
  checkpointing._join_orbax_threads(timeout=30)
  assert not t.is_alive()
  with pytest.raises(OSError, match="Forbidden"):  # the thread's own join still raises (the
    t.join()                                         # error is there: only the helper skips it)
  assert threading.current_thread() is threading.main_thread()
