"""Every job's stages are the names `heads_jax.pipelines.names` lists (what ``--redo`` takes and
``--help`` shows), and every job takes ``--redo STAGE|all`` (issue 42 item 3)."""

from pathlib import Path

import pytest

from heads_jax import cli
from heads_jax.pipelines import ablate, demo, guan, names
from heads_jax.pipelines import reproduce as rp


def test_the_pipelines_are_built_from_the_names(tmp_path):
  from heads_jax.training.configlib import load_config
  assert tuple(s.name for s in rp.PIPELINE) == names.REPRODUCE
  c = load_config("configs/reproduce.py:guan_toy")
  c.squad_model = str(tmp_path)   # an existing path: no hub look-up
  assert tuple(s.name for s in guan.pipeline_stages(guan.guan_job(c, tmp_path / "run"))) == \
      names.GUAN
  settings = demo.DemoSettings(out=Path("o"), real=Path("m"), name="m", quick=False, n=4,
                               finetune_steps=1, pretrain_steps=1, scratch_examples=2)
  assert tuple(s.name for s in demo.demo_stages(settings)) == names.DEMO
  assert ("baseline", *(j.name for j in ablate.SUB_JOBS), ablate.REPORT) == names.ABLATE


def test_the_config_file_lists_the_same_stages():
  import importlib.util
  from heads_jax.training.configlib import config_path
  spec = importlib.util.spec_from_file_location("_reproduce_cfg", config_path("configs/reproduce.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.STAGES == names.REPRODUCE


@pytest.mark.parametrize("command,stages", [
    ("analyze", names.ANALYZE), ("compare", names.COMPARE), ("ablate", names.ABLATE),
    ("trajectory", names.TRAJECTORY), ("demo", names.DEMO),
    ("reproduce", names.REPRODUCE + names.GUAN)])
def test_every_job_takes_redo_and_lists_its_stages(command, stages, capsys):
  with pytest.raises(SystemExit):
    cli.build_parser(command).parse_args([command, "--help"])
  text = " ".join(capsys.readouterr().out.split("--redo STAGE")[-1].split())
  for stage in stages:
    assert stage in text, (command, stage)
  assert "all" in text
