"""`heads-jax reproduce` takes the added GLUE tasks (MNLI, RTE, CoLA, STS-B, WNLI): task list,
splits per task, and their names in the report's paper table."""

import pytest

from heads_jax.errors import UserError
from heads_jax.hoststats import claims as paper
from heads_jax.pipelines.reproduce import task_list
from heads_jax.training import configlib


def test_added_tasks_are_reproduce_tasks():
  c = configlib.load_config("configs/reproduce.py:toy", ["tasks=rte,stsb,cola,wnli,mnli,mrpc"])
  assert task_list(c) == ("rte", "stsb", "cola", "wnli", "mnli", "mrpc")
  assert (c.data.mnli.train, c.data.mnli.eval, c.data.mnli.analysis) == (
      "train", "dev_matched", "test_matched")
  assert c.data.cola.max_seq_length == 64 and c.data.rte.source == "auto"
  assert [paper.TASK_NAMES[t] for t in ("mnli", "rte", "cola", "stsb", "wnli")] == [
      "MNLI", "RTE", "CoLA", "STS-B", "WNLI"]
  c = configlib.load_config("configs/reproduce.py:toy", ["tasks=ax"])
  with pytest.raises(UserError, match="comma-separated subset"):
    task_list(c)
