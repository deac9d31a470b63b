"""heads_jax.training.job (and configlib's run checks): a training run's bad settings are refused
before any device work; a resume under changed settings, into another task's or model's run
directory, or beside another running process is one line (nothing written); SIGTERM exits 143
after its checkpoint, Ctrl-C during a save 130 with one line, a full disk during a save one line
with the previous checkpoint intact; a training work directory given as a model says which
subfolder to give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from heads_jax.errors import UserError
from heads_jax import runfiles
from heads_jax.training import configlib, finetune, job as job_lib, loop, pretrain
from tests.training import fake_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiny(**kw):
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.batch_size, c.num_train_steps = 16, 6
  for k, v in kw.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c


def _ft(task="mrpc", **kw):
  c = configlib.load_config("configs/finetune.py:tiny")
  c.task = task
  for k, v in kw.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c


@pytest.fixture
def no_device(monkeypatch):
  """Any device work (the mesh, the distributed set-up) fails the test."""
  def boom(*a, **k):
    raise AssertionError("device work before the settings were checked")
  monkeypatch.setattr(job_lib, "data_mesh", boom)
  monkeypatch.setattr(job_lib, "initialize_from_config", boom)


@pytest.mark.parametrize("field,value,message", [
    ("batch_size", 0, "batch_size must be a positive integer, got 0"),
    ("num_train_steps", 0, "num_train_steps must be a positive integer, got 0"),
    ("num_train_steps", -3, "num_train_steps must be a positive integer, got -3"),
    ("optimizer.learning_rate", -1e-4, "optimizer.learning_rate must be a finite number >= 0"),
])
def test_bad_settings_are_refused_before_device_work(tmp_path, no_device, field, value, message):
  with pytest.raises(UserError, match=message):
    pretrain.train_and_evaluate(_tiny(**{field: value}), tmp_path / "pt")
  with pytest.raises(UserError, match=message):
    finetune.train_and_evaluate(_ft(**{field: value}), tmp_path / "ft")
  assert not (tmp_path / "pt").exists() and not (tmp_path / "ft").exists()


def test_a_bad_environment_variable_is_refused_before_device_work(tmp_path, no_device, monkeypatch):
  monkeypatch.setenv("HEADS_JAX_STORAGE_TIMEOUT", "abc")
  with pytest.raises(UserError) as e:
    pretrain.train_and_evaluate(_tiny(), tmp_path / "pt")
  assert str(e.value) == ("environment: HEADS_JAX_STORAGE_TIMEOUT must be a positive number of "
                          "seconds (e.g. 300), got 'abc'")
  assert not (tmp_path / "pt").exists()


def _started_run(workdir, config):
  """A run directory as a first run leaves it: config.json and a checkpoint folder."""
  j = job_lib.TrainingJob(config, workdir)
  j.create_dir()
  j.close()
  (workdir / "checkpoints" / "2").mkdir(parents=True)
  return (workdir / "config.json").read_bytes()


def test_resume_under_changed_settings_is_refused_unless_allowed(tmp_path):
  wd = tmp_path / "run"
  first = _started_run(wd, _tiny())
  # operational fields may change (stop_at_step, log_every, ...)
  job_lib.TrainingJob(_tiny(stop_at_step=4, log_every=1), wd).create_dir()
  with pytest.raises(UserError) as e:
    job_lib.TrainingJob(_tiny(batch_size=32, **{"optimizer.learning_rate": 1e-3}), wd).create_dir()
  assert str(e.value) == (
      f"{wd}: this run was started with other settings (batch_size 16 -> 32, "
      f"optimizer.learning_rate 0.01 -> 0.001); resuming would mix them: rerun with the same "
      f"settings, choose another --workdir, or pass --config.allow_changes=true to resume with "
      f"the changes (recorded)")
  assert (wd / "config.json").read_bytes() == first
  # allowed: the first config is kept, the change appended once the restore succeeded (issue 52
  # item 6: it was recorded before, and a failed restore left a false record behind)
  job = job_lib.TrainingJob(_tiny(batch_size=32, allow_changes=True), wd)
  job.create_dir()
  assert (wd / "config.json").read_bytes() == first
  assert not (wd / "config_changes.jsonl").exists()
  job.record_changes()   # what initial_state does after restoring the checkpoints
  job.close()
  rows = [json.loads(x) for x in (wd / "config_changes.jsonl").read_text().splitlines()]
  assert [r["changes"] for r in rows] == [{"batch_size": [16, 32]}]
  # the changed settings are now the run's: the same command resumes without a new record
  job_lib.TrainingJob(_tiny(batch_size=32), wd).create_dir()
  assert len((wd / "config_changes.jsonl").read_text().splitlines()) == 1
  # ... and going back is a change again
  with pytest.raises(UserError, match=r"batch_size 32 -> 16"):
    job_lib.TrainingJob(_tiny(), wd).create_dir()


def test_another_optimizer_layout_is_refused_before_the_restore(tmp_path):
  """optimizer.flat changes the optimizer state's layout: refused in one line before anything is
  restored or recorded, even with allow_changes (before: Orbax's five-line tree mismatch, after
  the change was recorded)."""
  wd = tmp_path / "run"
  first = _started_run(wd, _tiny())
  with pytest.raises(UserError, match=r"optimizer.flat False -> True changes the layout of the "
                                      r"optimizer state .* --config.optimizer.flat=False"):
    job_lib.TrainingJob(_tiny(allow_changes=True, **{"optimizer.flat": True}), wd).create_dir()
  assert (wd / "config.json").read_bytes() == first
  assert not (wd / "config_changes.jsonl").exists()


def test_another_model_size_is_refused_even_when_changes_are_allowed(tmp_path):
  wd = tmp_path / "run"
  first = _started_run(wd, _tiny())
  with pytest.raises(UserError, match=r"started with other model settings \(model.size 'tiny' -> "
                                      r"'mini'\); its checkpoints hold that model"):
    job_lib.TrainingJob(_tiny(allow_changes=True, **{"model.size": "mini"}), wd).create_dir()
  assert (wd / "config.json").read_bytes() == first
  assert not (wd / "config_changes.jsonl").exists()


def test_another_task_or_kind_of_run_is_refused(tmp_path):
  wd = tmp_path / "mrpc"
  first = _started_run(wd, _ft("mrpc"))
  # (the directory marker of heads_jax.runfiles, when there is one, refuses it first, else the
  # run's config.json does)
  with pytest.raises(UserError, match=r"(task mrpc; this is a fine-tuning run of task sst2|"
                                      r"task mrpc, not sst2).*choose another --workdir"):
    job_lib.TrainingJob(_ft("sst2", allow_changes=True), wd).create_dir()
  with pytest.raises(UserError, match="choose another --workdir"):
    job_lib.TrainingJob(_tiny(), wd).create_dir()
  assert (wd / "config.json").read_bytes() == first
  # through finetune.train_and_evaluate: refused before the data is encoded or anything written
  with pytest.raises(UserError, match="task mrpc"):
    finetune.train_and_evaluate(_ft("sst2"), wd)
  assert (wd / "config.json").read_bytes() == first
  # without the marker (a run of an older version), config.json tells
  for marker in wd.glob("*.json"):
    if marker.name not in ("config.json", "data.json"):
      marker.unlink()
  with pytest.raises(UserError, match=f"{wd} is a fine-tuning run of task mrpc; this is a "
                                      f"fine-tuning run of task sst2: choose another --workdir"):
    job_lib.TrainingJob(_ft("sst2", allow_changes=True), wd).create_dir()
  with pytest.raises(UserError, match=f"{wd} is a fine-tuning run of task mrpc; this is a "
                                      f"pre-training run: choose another --workdir"):
    job_lib.TrainingJob(_tiny(), wd).create_dir()
  # a directory whose config.json is not a training run's (e.g. a model)
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text(json.dumps({"hidden_size": 64}))
  with pytest.raises(UserError, match="holds a config.json that is not a training run's"):
    job_lib.TrainingJob(_tiny(), model).create_dir()


def _holder(workdir):
  """A process holding the lock of ``workdir`` until killed."""
  code = ("import sys, time\nfrom heads_jax.runfiles import WorkdirLock\n"
          "WorkdirLock(sys.argv[1], 'a training run').acquire()\nprint('held', flush=True)\n"
          "time.sleep(120)\n")
  p = subprocess.Popen([sys.executable, "-c", code, str(workdir)], stdout=subprocess.PIPE,
                       text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  assert p.stdout.readline().strip() == "held"
  return p


def test_a_second_process_is_refused_and_a_stale_lock_taken_over(tmp_path):
  wd = tmp_path / "run"
  holder = _holder(wd)
  try:
    with pytest.raises(UserError) as e:
      job_lib.TrainingJob(_tiny(), wd).create_dir()
    text = str(e.value)
    assert text.startswith(f"{wd} is in use by a training run (pid {holder.pid} on this host, "
                           f"started 20")
    assert "wait for it to end or choose another directory" in text
    assert not (wd / "config.json").exists()
  finally:
    holder.kill()
    holder.wait()
  # the holder was killed: its lock is stale and taken over with one line
  lines = []
  lock = runfiles.WorkdirLock(wd, "a training run", log=lines.append).acquire()
  assert len(lines) == 1 and lines[0].startswith(f"{wd}: taking over the lock of a training run "
                                                 f"(pid {holder.pid}, started ")
  assert json.loads((wd / runfiles.LOCK_FILE).read_text())["pid"] == os.getpid()
  lock.release()
  assert not (wd / runfiles.LOCK_FILE).exists()
  # a lock of another host cannot be checked: refused with the rm to run
  (wd / runfiles.LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "t",
                                                 "what": "a training run", "command": "x"}))
  with pytest.raises(UserError, match=f"pid 1 on host elsewhere.*rm {wd / runfiles.LOCK_FILE}"):
    runfiles.WorkdirLock(wd).acquire()


@pytest.mark.slow
def test_sigterm_saves_then_exits_143(tmp_path):
  p, lines, steps, _ = fake_run.launch("sigterm", tmp_path / "run")
  assert p.returncode == 143, p.stderr[-2000:]
  assert "done" not in p.stdout
  assert steps == [2, 3]
  assert lines == [f"heads-jax: stopped by SIGTERM after saving; the last complete checkpoint is "
                   f"step 3 in {tmp_path / 'run' / 'checkpoints'}; run the same command again "
                   f"to resume"]
  assert not (tmp_path / "run" / runfiles.LOCK_FILE).exists()


@pytest.mark.slow
def test_ctrl_c_during_a_save_is_one_line_and_the_save_finishes(tmp_path):
  p, lines, steps, _ = fake_run.launch("interrupt", tmp_path / "run")
  assert p.returncode == 130, p.stderr[-2000:]
  assert steps == [2, 4]  # the save in flight was finished, not torn
  assert lines == [f"heads-jax: interrupted (Ctrl-C); the last complete checkpoint is step 4 in "
                   f"{tmp_path / 'run' / 'checkpoints'}; run the same command again to resume"]


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_line_and_the_previous_checkpoint_intact(tmp_path):
  p, lines, steps, _ = fake_run.launch("nospace", tmp_path / "run")
  assert p.returncode == 2, p.stderr[-2000:]
  assert steps == [2, 4]
  assert sorted(x.name for x in (tmp_path / "run" / "checkpoints").iterdir()) == ["2", "4"]
  assert len(lines) == 1 and lines[0].startswith(
      f"heads-jax fake: error: no space left on the device of {tmp_path / 'run'} while writing")
  assert "the last complete checkpoint is step 4" in lines[0] and \
      "removed the partial save 6.orbax-checkpoint-tmp-1" in lines[0]


def test_a_training_workdir_given_as_a_model_names_the_subfolder(tmp_path):
  from heads_jax import load_model
  wd = tmp_path / "run"
  _started_run(wd, _tiny())
  with pytest.raises(UserError, match=f"{wd} is a training run's work directory, not a model, and "
                                      f"it has no exported model yet .*init_checkpoint="
                                      f"{wd / 'checkpoints'}"):
    load_model(wd)
  (wd / "model").mkdir()
  (wd / "model" / "heads_jax.json").write_text("{}")
  message = f"{wd} is a training run's work directory, not a model: give its exported model, " \
            f"{wd / 'model'}"
  with pytest.raises(UserError) as e:
    load_model(wd)
  assert str(e.value) == message
  with pytest.raises(UserError) as e:  # as a fine-tuning run's init_checkpoint
    loop.load_init_model(str(wd), "classification", num_labels=2)
  assert str(e.value) == message


def test_reproduce_refuses_a_bad_grid_before_any_stage(tmp_path, monkeypatch):
  from heads_jax.pipelines import reproduce
  monkeypatch.setattr(reproduce, "run_pipeline", lambda *a, **k: pytest.fail("a stage ran"))
  c = configlib.load_config("configs/reproduce.py:toy")
  c.finetune.batch_sizes = (8, 0)
  with pytest.raises(UserError, match="batch_size must be a positive integer, got 0"):
    reproduce.run_reproduce(c, tmp_path / "rep")
  c.finetune.batch_sizes, c.finetune.learning_rates = (8,), (-1e-3,)
  with pytest.raises(UserError, match="optimizer.learning_rate must be a finite number >= 0"):
    reproduce.run_reproduce(c, tmp_path / "rep")


def test_a_damaged_data_identity_is_one_line_naming_it(tmp_path):
  wd = tmp_path / "run"
  j = job_lib.TrainingJob(_tiny(), wd)
  j.create_dir()
  (wd / "data_identity.json").write_text("")
  with pytest.raises(UserError, match=r"data_identity.json is not valid JSON .*remove it"):
    j.check_data({"a": "1 bytes, sha256 0"})
  (wd / "data_identity.json").write_text("[1]")
  with pytest.raises(UserError, match="does not hold a data identity"):
    j.check_data({"a": "1 bytes, sha256 0"})
  (wd / "data_identity.json").unlink()
  j.check_data({"a": "1 bytes, sha256 0"})      # removed: the current data is recorded
  j.close()


def test_a_full_disk_during_the_export_is_one_line(tmp_path, monkeypatch):
  """safetensors reports a full disk as a SafetensorError (not an OSError): one UserError line
  naming what was being written, not a traceback."""
  class SafetensorError(Exception):
    pass

  def no_space(model, tokenizer, local, id2label=None):   # export_hf's order of arguments
    assert tokenizer == "TOKENIZER" and isinstance(local, os.PathLike)
    raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                          'message: "No space left on device" })')

  wd = tmp_path / "run"
  j = job_lib.TrainingJob(_tiny(), wd)
  monkeypatch.setattr(job_lib.steps, "merge_model", lambda parts, params: object())
  monkeypatch.setattr(job_lib, "save_model", lambda model, local, tok, id2label=None:
                      (local / "written").write_text(tok))
  monkeypatch.setattr(job_lib, "export_hf", no_space)
  with pytest.raises(UserError) as e:
    j.export({"w": 1.0}, "TOKENIZER", "model", "hf")
  text = str(e.value)
  assert "\n" not in text and text.startswith("no space left on the device while writing the "
                                              f"Hugging Face model to {wd / 'hf'} (Error while")
  assert "run the same command again" in text
  assert (wd / "model" / "written").read_text() == "TOKENIZER"   # each writer its own arguments
  monkeypatch.setattr(job_lib, "export_hf", lambda *a, **k: (_ for _ in ()).throw(ValueError("x")))
  with pytest.raises(ValueError):   # anything else is not a disk problem: raised as it is
    j.export({"w": 1.0}, "TOKENIZER", "model", "hf")


def test_every_process_checks_it_reads_the_same_data(tmp_path, monkeypatch):
  """Several hosts: each compares its data's digest with process 0's (broadcast) and all refuse
  when one differs (simulated: one process, the collectives stubbed)."""
  import numpy as np
  from jax.experimental import multihost_utils
  j = job_lib.TrainingJob(_tiny(), tmp_path / "run")
  j.same_data_on_every_process({"a": "x"})          # one process: nothing to compare
  j.process_count = 3
  monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda x: x)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda ok: np.array([True, bool(ok), False]))
  with pytest.raises(UserError, match=r"process\(es\) 2 read other files than process 0"):
    j.same_data_on_every_process({"a": "x"})
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda ok: np.array([True, True, True]))
  j.same_data_on_every_process({"a": "x"})


def test_a_failing_train_releases_the_work_directory(tmp_path, monkeypatch):
  """An error out of ``train`` (a failed save, a non-finite loss) releases the lock at once, not
  at the interpreter's exit: another job can take the directory."""
  wd = tmp_path / "run"
  j = job_lib.TrainingJob(_tiny(), wd)
  j.create_dir()

  def fail(*args, **kwargs):
    raise UserError("the checkpoint of step 4 could not be written")

  monkeypatch.setattr(j, "_train", fail)
  assert (wd / ".heads_jax.lock").exists()
  with pytest.raises(UserError, match="step 4"):
    j.train({}, None, [], seq_len=8, meta={})
  assert not (wd / ".heads_jax.lock").exists()
  again = job_lib.TrainingJob(_tiny(), wd)
  again.create_dir()                      # not refused: the lock was released
  again.close()
