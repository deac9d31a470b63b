"""heads_jax.training.rundir: every path of a run's work directory, local or a URL."""

import pytest

from heads_jax.training.rundir import RunDir


@pytest.mark.parametrize("root", ["/tmp/run", "gs://bucket/run"])
def test_paths_sit_under_the_root_and_stay_urls(root):
  run = RunDir(root)
  assert str(run.config_file) == f"{root}/config.json"
  assert str(run.data_identity_file) == f"{root}/data_identity.json"
  assert str(run.tensorboard_dir) == f"{root}/tb"
  assert str(run.best) == f"{root}/best" and str(run.sub("best_hf")) == f"{root}/best_hf"
  assert RunDir(run).metrics_file == run.metrics_file


def test_a_path_cannot_be_reassigned():
  with pytest.raises(AttributeError, match="RunDir.checkpoints is the fixed path 'checkpoints'"):
    RunDir("/tmp/run").checkpoints = "/elsewhere"
