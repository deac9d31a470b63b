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


def _stage_pipelines(tmp_path):
  """``(job name, its engine config, its stages)`` of every job, built from small configs."""
  from heads_jax.pipelines import analyze, compare, trajectory
  from heads_jax.training.configlib import load_config
  c = load_config("configs/reproduce.py:guan_toy")
  c.squad_model = str(tmp_path)   # an existing path: no hub look-up
  gjob = guan.guan_job(c, tmp_path / "run")
  settings = demo.DemoSettings(out=Path("o"), real=Path("m"), name="m", quick=False, n=4,
                               finetune_steps=1, pretrain_steps=1, scratch_examples=2)
  ajob = ablate.ablation_job(ablate.AblationConfig(model="m", data="mrpc", out="o", by="layer",
                                                   importance=True, prune=True, cross="both"))
  cc = compare.CompareConfig(before="b", after="a", out="o", before_model="m", after_model="n")
  tc = trajectory.TrajectoryConfig(run="r", out="o", model_dir="m", checkpoints="r/c",
                                   steps=(1,), data=("ud-ewt",), max_examples=2, max_length=8,
                                   batch_size=2, roles=("local",), syntax=True, rule="paper")
  run = analyze.AnalyzeRun(settings=None, model={})
  return [("reproduce", load_config("configs/reproduce.py:toy"), rp.PIPELINE),
          ("guan", gjob, guan.pipeline_stages(gjob)), ("demo", settings, demo.demo_stages(settings)),
          ("ablate", ajob, ablate.ablation_stages(ajob)), ("compare", cc, compare.compare_stages(cc)),
          ("trajectory", tc, trajectory.trajectory_stages(tc)), ("analyze", run, analyze.PLAN)]


def test_every_stage_is_typed_by_its_jobs_config(tmp_path):
  # issue 42 item 2: a walk from each job's config reaches its stages, whose ctx is typed with
  # that config (or with the field of it that the stage's `part` names), not `Any`
  import functools
  import typing
  from heads_jax.pipelines.engine import Context
  for job, config, plan in _stage_pipelines(tmp_path):
    for stage in plan:
      fn = stage.run.func if isinstance(stage.run, functools.partial) else stage.run
      hint = typing.get_type_hints(fn)["ctx"]
      assert typing.get_origin(hint) is Context, (job, stage.name, hint)
      (want,) = typing.get_args(hint)
      seen = getattr(config, stage.part) if stage.part else config
      assert isinstance(seen, want), (job, stage.name, want, type(seen))
