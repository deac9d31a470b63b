"""The ablation job's inputs and state (issue 28 part 2): a classifier of another task is refused
before any evaluation; the output directory says what it is."""

import json

import pytest

from heads_jax import runfiles
from heads_jax.data import glue
from heads_jax.errors import UserError
from heads_jax.pipelines.ablate import AblationConfig, check_classifier_task, classifier_task, run_ablation


def _classifier_dir(path, id2label, manifest="heads_jax.json"):
  path.mkdir(parents=True)
  (path / manifest).write_text(json.dumps({"format": "heads_jax", "id2label": id2label}))
  return path


def test_classifier_of_another_task_is_refused(tmp_path):
  # Before: `ablate` scored an SST-2 classifier on MRPC without a word (both have 2 labels).
  sst2 = _classifier_dir(tmp_path / "sst2", {"0": "negative", "1": "positive"})
  assert classifier_task(sst2) == (None, ("negative", "positive"))
  with pytest.raises(UserError, match="predicts the labels negative, positive, but mrpc's labels "
                                      "are not_equivalent, equivalent"):
    check_classifier_task(sst2, glue.task_info("mrpc"))
  check_classifier_task(sst2, glue.task_info("sst2"))  # its own task
  # a Hugging Face config.json; generic LABEL_i names say nothing
  hf = _classifier_dir(tmp_path / "hf", {"0": "LABEL_0", "1": "LABEL_1"}, "config.json")
  assert classifier_task(hf) == (None, None)
  check_classifier_task(hf, glue.task_info("mrpc"))
  # the fine-tuning run it was exported into says its task (QNLI and RTE share label names)
  run = tmp_path / "run"
  runfiles.claim_dir(run, "finetuning", flag="--workdir", task="qnli")
  best = _classifier_dir(run / "best_model", {"0": "entailment", "1": "not_entailment"})
  assert classifier_task(best) == ("qnli", ("entailment", "not_entailment"))
  with pytest.raises(UserError, match="was fine-tuned on qnli, but the data is rte"):
    check_classifier_task(best, glue.task_info("rte"))


def test_out_of_another_kind_or_a_file_is_refused_before_loading(tmp_path, monkeypatch):
  import heads_jax.pipelines.ablate as ablate_mod
  monkeypatch.setattr(ablate_mod, "_load", lambda config: pytest.fail("loaded the model"))
  analysis = tmp_path / "analysis"
  runfiles.claim_dir(analysis, "analysis")
  cfg = AblationConfig(model="m", data="mrpc", out=str(analysis), by="layer")
  with pytest.raises(UserError, match="is an analysis directory"):
    run_ablation(cfg)
  (tmp_path / "f").write_text("")
  with pytest.raises(UserError, match="is a file; give a directory"):
    run_ablation(AblationConfig(model="m", data="mrpc", out=str(tmp_path / "f"), by="layer"))
  assert not (tmp_path / "new").exists()
