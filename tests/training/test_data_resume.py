"""A training run records its training data's content (issue 34): a resume whose data changed
behind the same path is refused with one line unless ``allow_changes`` (then the change is
recorded), for GLUE and SQuAD fine-tuning and pre-training; the same content under another path
resumes. The runs stop before any model work (``init_model`` is replaced), so each case takes
seconds."""

from __future__ import annotations

import json
import shutil

import pytest

from heads_jax.data.assets import glue_dir
from heads_jax.errors import UserError
from heads_jax.training import configlib, finetune, job as job_lib, pretrain
from tests.training.test_squad import _squad_file


class _Stop(Exception):
  pass


@pytest.fixture
def no_model(monkeypatch):
  """Each run stops where the model would be built (after its data checks)."""
  def stop(self, *a, **k):
    raise _Stop
  monkeypatch.setattr(job_lib.TrainingJob, "init_model", stop)


def _start(run, workdir, config):
  """Runs ``run(config, workdir)`` to the model; gives it a checkpoint, as a started run has."""
  with pytest.raises(_Stop):
    run(config, workdir)
  (workdir / "checkpoints" / "2").mkdir(parents=True, exist_ok=True)


def _changed_line(workdir, what):
  return (f"{workdir}: this run was trained on other data (changed since: {what}); resuming "
          f"would continue on other examples: restore the data, choose another --workdir, or "
          f"pass --config.allow_changes=true to resume on the new data (recorded)")


def _refused_then_allowed(run, workdir, config, what, capsys):
  with pytest.raises(UserError) as e:
    run(config, workdir)
  assert str(e.value) == _changed_line(workdir, what)
  before = json.loads((workdir / "data_identity.json").read_text())
  assert not (workdir / "config_changes.jsonl").exists()
  config.allow_changes = True
  with pytest.raises(_Stop):  # allowed: it goes on to the model
    run(config, workdir)
  assert f"resuming on changed data (recorded in {workdir / 'config_changes.jsonl'}): {what}" in \
      capsys.readouterr().out
  rows = [json.loads(x) for x in (workdir / "config_changes.jsonl").read_text().splitlines()]
  assert len(rows) == 1 and rows[0]["changes"] == {}
  assert rows[0]["data"]["before"] == before
  assert rows[0]["data"]["now"] == json.loads((workdir / "data_identity.json").read_text())
  config.allow_changes = False  # the new data is the run's now: the same command resumes
  with pytest.raises(_Stop):
    run(config, workdir)


def test_glue_rows_changed_behind_the_path(tmp_path, no_model, capsys):
  shutil.copytree(glue_dir(), tmp_path / "glue")
  c = configlib.load_config("configs/finetune.py:tiny_sst2", [f"data.glue_dir={tmp_path / 'glue'}"])
  work = tmp_path / "run"
  _start(finetune.train_and_evaluate, work, c)
  with pytest.raises(_Stop):  # the same rows: resumes
    finetune.train_and_evaluate(c, work)
  tsv = tmp_path / "glue" / "SST-2" / "dev.tsv"
  lines = tsv.read_text().splitlines()
  lines[5] = lines[5].replace("\t0", "\t1") if lines[5].endswith("\t0") else lines[5][:-1] + "0"
  tsv.write_text("\n".join(lines) + "\n")
  train, ev, _ = finetune.task_splits(c)
  changed = "train" if any(r.idx == 4 for r in train) else "eval"
  _refused_then_allowed(finetune.train_and_evaluate, work, c, changed, capsys)


def test_squad_file_replaced_behind_the_path(tmp_path, no_model, capsys):
  f = _squad_file(tmp_path / "squad.json")
  c = configlib.load_config("configs/finetune.py:tiny_squad", [
      f"squad.train_file={f}", "squad.eval_titles=Article_2", "data.max_examples=0"])
  work = tmp_path / "run"
  _start(finetune.train_and_evaluate, work, c)
  data = json.loads(f.read_text())
  data["data"][0]["paragraphs"][0]["qas"][0]["question"] = "Which city is the capital?"
  f.write_text(json.dumps(data))
  _refused_then_allowed(finetune.train_and_evaluate, work, c, "train", capsys)


def test_pretraining_text_changed_but_not_moved(tmp_path, no_model, capsys):
  text = tmp_path / "books" / "a.txt"
  text.parent.mkdir()
  text.write_text("One sentence here. Another one follows.\n\nA second paragraph is here.\n" * 20)
  c = configlib.load_config("configs/pretrain.py:tiny", [f"data.sources={text}"])
  work = tmp_path / "run"
  _start(pretrain.train_and_evaluate, work, c)
  moved = tmp_path / "moved" / "b.txt"  # the same content under another path: the same data
  moved.parent.mkdir()
  shutil.copy(text, moved)
  c.data.sources = str(moved)
  with pytest.raises(_Stop):
    pretrain.train_and_evaluate(c, work)
  moved.write_text(moved.read_text().replace("second", "third"))
  _refused_then_allowed(pretrain.train_and_evaluate, work, c, str(moved), capsys)
