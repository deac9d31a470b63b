"""`heads-jax --help` answers at once: no job (and so no JAX, transformers, scipy or matplotlib)
is imported to build the parser or show a command's help; descriptions are whole sentences;
`reproduce --help` lists its presets."""

import resource
import subprocess
import sys

import pytest

from heads_jax import cli

HEAVY = ("jax", "transformers", "scipy", "matplotlib", "torch", "flax", "pandas")


def _cpu_seconds(args) -> tuple[float, str]:
  """CPU seconds (user + system) of `python -m heads_jax.cli ARGS` in a fresh process."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  out = subprocess.run([sys.executable, "-m", "heads_jax.cli", *args], capture_output=True,
                       text=True, check=True).stdout
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["reproduce", "--help"]])
def test_help_takes_under_one_cpu_second(args):
  seconds, out = _cpu_seconds(args)
  assert out.startswith("usage: heads-jax")
  assert seconds < 1.0, f"heads-jax {' '.join(args)}: {seconds:.2f} CPU-seconds"


def test_building_the_parser_imports_no_heavy_library():
  code = ("import sys; from heads_jax import cli; cli.build_parser(); "
          f"print([m for m in {HEAVY!r} if m in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]", out


def test_descriptions_are_whole_sentences(capsys):
  for name in cli.SUBCOMMANDS:
    with pytest.raises(SystemExit):
      cli.main([name, "--help"])
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]  # usage, blank line, description
    assert description.rstrip().endswith((".", ")")), (name, description)
    assert "Thin entry point" not in text, name


def _help(capsys, name):
  with pytest.raises(SystemExit):
    cli.main([name, "--help"])
  return " ".join(capsys.readouterr().out.split())


def _config_module(name):
  import importlib.util
  from heads_jax.training.configlib import config_path
  spec = importlib.util.spec_from_file_location(f"_help_{name}", config_path(f"configs/{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_reproduce_help_lists_its_presets(capsys):
  text = _help(capsys, "reproduce")
  config = _config_module("reproduce")
  for name in config.PRESETS + config.GUAN_PRESETS:
    assert f" {name}:" in text or f" {name}," in text, name
  for stage in config.STAGES:  # --redo's choices, written out in its help
    assert stage in text.split("--redo STAGE")[-1], stage


def test_help_texts_name_the_library_values(capsys, monkeypatch):
  """Values the entry modules write out in help (so as not to import the library to build the
  parser) are the library's."""
  monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside hyphenated names
  from heads_jax.ablation.groups import GROUPINGS
  from heads_jax.data.corpora import PART_BYTES
  from heads_jax.data.prepare import DEFAULT_HELDOUT
  ablate = _help(capsys, "ablate").split("--by GROUPING")[-1].split("--role-level")[0]
  for g in GROUPINGS:
    assert f"({g})" in ablate or f" {g}:" in ablate or f"({g};" in ablate, g
  prepare = _help(capsys, "prepare-corpus")
  assert f"default {DEFAULT_HELDOUT}:" in prepare and f"default {PART_BYTES}:" in prepare


def test_an_unknown_grouping_is_one_line(capsys):
  assert cli.main(["ablate", "--model", "m", "--data", "mrpc", "--out", "o", "--by", "bogus"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--by bogus" in err and "cluster-pairs" in err
