"""Job markers (`heads_jax.runfiles.claim_dir` / `check_dir`): every directory a job writes says
what it is, and a job refuses a file, another kind's directory or another task's (issue 28)."""

import json

import pytest

from heads_jax import runfiles
from heads_jax.errors import UserError


@pytest.mark.parametrize("files,kind", [
    (["scores.npz"], "analysis"), (["run.json"], "analysis"), (["compare.json"], "comparison"),
    (["ablation.json"], "ablation"), (["reproduce_config.json"], "reproduce"), (["demo.json"], "demo"),
    (["checkpoints/"], "training"), (["metrics.jsonl", "summary.json"], "training"),
    (["heads_jax.json", "params.safetensors", "config.json"], "model"),
    (["config.json", "model.safetensors"], "model"), (["notes.txt"], None), ([], None),
])
def test_unmarked_directories_are_recognised_by_their_files(tmp_path, files, kind):
  d = tmp_path / "d"
  d.mkdir()
  for f in files:
    (d / f).mkdir() if f.endswith("/") else (d / f).write_text("{}")
  assert runfiles.guess_kind(d) == kind


def test_claim_check_and_refusals(tmp_path):
  d = tmp_path / "a"
  assert runfiles.check_dir(d, "analysis") is None and not d.exists()  # nothing created
  doc = runfiles.claim_dir(d, "analysis", model=tmp_path / "m", data=["ud-ewt"], settings={"k": 1})
  on_disk = json.loads((d / runfiles.JOB_FILE).read_text())
  assert on_disk == doc and doc["kind"] == "analysis" and doc["model"] == str(tmp_path / "m")
  assert doc["data"] == ["ud-ewt"] and doc["settings"] == {"k": 1} and doc["created"]
  again = runfiles.claim_dir(d, "analysis", settings={"k": 2})  # the same kind: accepted
  assert again["created"] == doc["created"] and again["settings"] == {"k": 2}
  for kind in ("comparison", "ablation", "finetuning", "demo"):
    with pytest.raises(UserError, match=f"--out {d} is an analysis directory \\(written by "
                                        "`heads-jax analyze`\\).*choose another --out"):
      runfiles.check_dir(d, kind)
  # tasks
  ft = tmp_path / "ft"
  runfiles.claim_dir(ft, "finetuning", flag="--workdir", task="sst2")
  runfiles.check_dir(ft, "finetuning", flag="--workdir", task="sst2")
  with pytest.raises(UserError, match="holds the finetuning of task sst2, not mrpc.*--workdir"):
    runfiles.check_dir(ft, "finetuning", flag="--workdir", task="mrpc")
  # an unmarked training directory may be either training kind
  old = tmp_path / "old"
  (old / "checkpoints").mkdir(parents=True)
  runfiles.check_dir(old, "pretraining")
  runfiles.check_dir(old, "finetuning", task="sst2")
  with pytest.raises(UserError, match="is a training directory"):
    runfiles.check_dir(old, "analysis")
  # a file; a damaged marker
  (tmp_path / "f").write_text("")
  with pytest.raises(UserError, match="--workdir .*f is a file; give a directory"):
    runfiles.check_dir(tmp_path / "f", "pretraining", flag="--workdir")
  (d / runfiles.JOB_FILE).write_text("{")
  with pytest.raises(UserError, match=f"{d / runfiles.JOB_FILE} is damaged"):
    runfiles.check_dir(d, "analysis")
