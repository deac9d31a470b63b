"""Runs whose paths are ``gs://`` URLs, against a GCS emulator on localhost (tests/gcs_emulator.py):
pre-training checkpoints to a bucket, stops, resumes there and ends as an uninterrupted local run;
fine-tuning from a ``gs://`` init checkpoint (an Orbax run and a model directory); ``analyze``
writes its files to a bucket. Plus the path rules of heads_jax.storage, without a server.

Under both emulators (gcp-storage-emulator and fake-gcs-server, under which issue 28's run hung
after its step-40 save: the metrics upload and Orbax's finalisation both waiting on fsspec's
loop), the ``heads-jax pretrain`` command with checkpoints every 20 steps, 60 steps, killed after
step 45 and run again, finishes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from heads_jax import contract
from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
from heads_jax import storage
from heads_jax.model.checkpoint import MANIFEST
from heads_jax.training import configlib, finetune, metrics, pretrain
from heads_jax.training.rundir import RunDir
from tests.gcs_emulator import FakeGcsServer, GcsEmulator
from tests.helpers import skip_unless_ci

BUCKET = "heads-jax-test"


def test_urls_stay_urls_and_local_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  run = RunDir("gs://bkt/runs/pt1")
  assert str(run) == "gs://bkt/runs/pt1" and run.is_remote
  assert os.fspath(run.checkpoints) == "gs://bkt/runs/pt1/checkpoints"
  assert os.fspath(run.sub("model")) == "gs://bkt/runs/pt1/model"
  assert storage.display("gs://bkt/x/") == "gs://bkt/x"
  local = RunDir("runs/a")
  assert str(local) == str(tmp_path / "runs" / "a") and not local.is_remote
  assert storage.is_url("s3://b/k") and not storage.is_url("gs:/b/k") and not storage.is_url("a/b")
  assert storage.local_copy("bert-base-uncased") == "bert-base-uncased"  # names pass through
  assert not (tmp_path / "gs:").exists()
  # staged output of a local directory is the directory itself
  with storage.staged_output(tmp_path / "out") as d:
    (d / "f.txt").write_text("x")
  assert (tmp_path / "out" / "f.txt").read_text() == "x"


@pytest.fixture(scope="module")
def gcs():
  with GcsEmulator(BUCKET) as emulator:
    yield emulator


def _tiny(steps_=6, **kw):
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.data.max_seq_length, c.data.max_predictions = 32, 5
  c.batch_size = 16
  c.num_train_steps = steps_
  c.optimizer.warmup_steps = 2
  c.checkpoint.every_steps = 2
  c.checkpoint.keep = 2
  c.log_every = 1
  c.eval_batches = 0
  c.export = False
  c.tensorboard = False
  for k, v in kw.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c


def _leaves(tree):
  return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def pretrained(gcs, tmp_path_factory):
  """An uninterrupted local run and a bucket run stopped at step 4 and resumed."""
  tmp = tmp_path_factory.mktemp("pt")
  cwd = os.getcwd()
  os.chdir(tmp)  # a URL mistaken for a local path would create ./gs: here
  os.environ["HEADS_JAX_REMOTE_CACHE"] = str(tmp / "cache")
  try:
    full = pretrain.train_and_evaluate(_tiny(export=True), tmp / "local")
    url = f"gs://{BUCKET}/run"
    part = pretrain.train_and_evaluate(_tiny(stop_at_step=4, tensorboard=True), url)
    resumed = pretrain.train_and_evaluate(_tiny(export=True, tensorboard=True), url)
  finally:
    os.chdir(cwd)
  return {"tmp": tmp, "url": url, "full": full, "part": part, "resumed": resumed}


@pytest.mark.slow
def test_pretraining_in_a_bucket_resumes_like_an_uninterrupted_local_run(pretrained):
  full, part, resumed, url = (pretrained[k] for k in ("full", "part", "resumed", "url"))
  assert part["final_step"] == 4 and resumed["start_step"] == 4
  assert resumed["origin"] == f"resumed:{url}/checkpoints@4"
  losses = {h["step"]: h["loss"] for h in full["history"]}
  assert [h["loss"] for h in part["history"]] == [losses[s] for s in (1, 2, 3, 4)]
  assert [h["loss"] for h in resumed["history"]] == [losses[s] for s in (5, 6)]
  for a, b in zip(_leaves(full["state"]), _leaves(resumed["state"])):
    np.testing.assert_array_equal(a, b)
  root = storage.as_path(url)
  assert sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit()) == [4, 6]
  assert json.loads((root / "config.json").read_text())["num_train_steps"] == 6
  rows = metrics.read_metrics(url, "train")
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
  assert [r["loss"] for r in rows] == [losses[s] for s in range(1, 7)]
  assert any(p.name.startswith("events.out.tfevents") for p in (root / "tb").iterdir())
  assert (root / "model" / MANIFEST).exists() and (root / "hf" / "config.json").exists()
  assert not (pretrained["tmp"] / "gs:").exists()


@pytest.mark.slow
def test_finetuning_from_a_gs_init_checkpoint(pretrained, tmp_path):
  url = pretrained["url"]

  def run(init, workdir):
    c = configlib.load_config("configs/finetune.py:tiny_sst2",
                              ["num_train_steps=3", "eval_every=3", "log_every=1",
                               "data.max_examples=96", "eval_batch_size=32", "tensorboard=False",
                               f"init_checkpoint={init}"])
    return finetune.train_and_evaluate(c, workdir)

  # the encoder of the bucket run's Orbax checkpoints ...
  from_orbax = run(f"{url}/checkpoints", f"gs://{BUCKET}/ft_orbax")
  assert from_orbax["origin"] == f"params:{url}/checkpoints@6"
  root = storage.as_path(f"gs://{BUCKET}/ft_orbax")
  assert (root / "best_model" / MANIFEST).exists()
  assert json.loads((root / "summary.json").read_text())["final_step"] == 3
  # ... and its exported model directory, which trains exactly like the same directory on disk
  from_dir = run(f"{url}/model", tmp_path / "ft_dir")
  from_local = run(pretrained["tmp"] / "local" / "model", tmp_path / "ft_local")
  assert from_dir["origin"] == f"model:{url}/model"
  assert [h["loss"] for h in from_dir["history"]] == [h["loss"] for h in from_local["history"]]
  # the Orbax encoder and the exported model hold the same parameters: same training
  assert [h["loss"] for h in from_orbax["history"]] == [h["loss"] for h in from_local["history"]]


@pytest.mark.slow
def test_analyze_writes_its_files_to_a_bucket(pretrained, tmp_path):
  url = f"gs://{BUCKET}/heads"

  def cfg(model, out):
    return AnalysisConfig(model=str(model), data=("ud-ewt",), out=str(out), max_examples=8,
                          batch_size=8, measures=False, report=True, clusters=2)

  res = run_analysis(cfg(f"{pretrained['url']}/model", url), progress=False, log=lambda *a: None)
  assert os.fspath(res["out"]) == url and os.fspath(res["report"]) == f"{url}/report.html"
  root = storage.as_path(url)
  names = {p.name for p in root.iterdir()}
  assert {contract.SCORES_FILE, contract.TESTS_CSV, contract.TESTS_JSON, contract.SETTINGS_JSON,
          contract.CLUSTERS_CSV, contract.SUMMARY_JSON, contract.RUN_FILE,
          "report.html"} <= names, names
  local = run_analysis(cfg(pretrained["tmp"] / "local" / "model", tmp_path / "heads"),
                       progress=False, log=lambda *a: None)
  remote_scores = contract.read_scores(storage.local_copy(url, tmp_path / "copy"))
  local_scores = contract.read_scores(local["out"])
  np.testing.assert_array_equal(remote_scores.sieve_bias, local_scores.sieve_bias)
  np.testing.assert_array_equal(remote_scores.distance, local_scores.distance)
  # a second run into the bucket finds the first run's scores there and reuses them
  lines = []
  run_analysis(cfg(f"{pretrained['url']}/model", url), progress=False, log=lines.append)
  assert any(str(line).lstrip().startswith("reusing") for line in lines), lines


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["pretrain", "--config", "configs/pretrain.py:tiny", "--config.num_train_steps=60",
        "--config.checkpoint.every_steps=20", "--config.batch_size=16",
        "--config.data.max_seq_length=32", "--config.data.max_predictions=5",
        "--config.eval_batches=0", "--config.export=false", "--config.log_every=1",
        "--config.optimizer.warmup_steps=2", "--config.tensorboard=true"]


@pytest.mark.slow
@pytest.mark.parametrize("emulator", [GcsEmulator, FakeGcsServer])
def test_the_pretrain_command_killed_and_resumed_finishes_in_a_bucket(emulator, tmp_path):
  try:
    server = emulator("bkt28").start()
  except RuntimeError as e:  # fake-gcs-server not installed (it is in the test extra)
    skip_unless_ci(str(e))
  url = "gs://bkt28/pt"
  # a stall ends the job with exit 2 and one line instead of a hang (heads_jax.storage.watch)
  env = dict(os.environ, HEADS_JAX_STORAGE_TIMEOUT="120", PYTHONPATH=ROOT,
             HEADS_JAX_REMOTE_CACHE=str(tmp_path / "cache"))
  cmd = [sys.executable, "-m", "heads_jax.cli", *ARGS, "--workdir", url]
  try:
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=tmp_path)
    seen = []
    for line in first.stdout:
      seen.append(line)
      if line.startswith("step 45/"):
        first.kill()  # after the step-40 save: killed, as a pre-empted VM is
        break
    first.wait(timeout=60)
    assert first.returncode == -9, "".join(seen)[-3000:]
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path,
                            timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    # the step-40 save is finished asynchronously: a kill may land before it is complete
    start = re.search(r"from resumed:\S+@(\d+) at step (\d+)/60", out)
    assert start and start[1] == start[2] and int(start[1]) in (20, 40), out[-3000:]
    assert f"done: step 60 in {url}" in out
    assert "taking over the lock of a training run" in out  # the killed run's lock
    root = storage.as_path(url)
    assert sorted(int(p.name) for p in (root / "checkpoints").iterdir() if p.name.isdigit()) == \
        [20, 40, 60]
    n = 60 - int(start[1])
    assert [r["step"] for r in metrics.read_metrics(url, "train")][-n:] == \
        list(range(int(start[1]) + 1, 61))
  finally:
    server.stop()
