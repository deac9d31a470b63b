"""heads_jax/env.py: the one module that reads environment variables, and the only one."""

from __future__ import annotations

import ast
import re
import os
from pathlib import Path

import pytest

from heads_jax import env

REPO = Path(__file__).resolve().parents[1]


def test_get_defaults_overrides_and_unknown_names():
  assert env.get("HEADS_JAX_CACHE_DIR", {}) == os.path.expanduser("~/.cache/heads_jax/xla")
  assert env.get("HEADS_JAX_CACHE_DIR", {"HEADS_JAX_CACHE_DIR": "/x"}) == "/x"
  assert env.get("XLA_FLAGS", {}) == ""
  with pytest.raises(KeyError, match="not a documented heads_jax environment variable"):
    env.get("HEADS_JAX_NOPE", {})
  assert env.is_off("HEADS_JAX_XLA_FLAGS", {"HEADS_JAX_XLA_FLAGS": "Off"})
  assert not env.is_off("HEADS_JAX_XLA_FLAGS", {})
  assert env.is_true("HF_HUB_OFFLINE", {"HF_HUB_OFFLINE": "yes"})
  assert not env.is_true("HF_HUB_OFFLINE", {"HF_HUB_OFFLINE": "0"})
  environ = {"TOKENIZERS_PARALLELISM": "true"}
  assert env.set_default("TOKENIZERS_PARALLELISM", "false", environ) == "true"
  environ = {}
  assert env.set_default("TOKENIZERS_PARALLELISM", "false", environ) == "false"
  env.put("XLA_FLAGS", "--a=1", environ)
  assert env.in_force(environ) == {"TOKENIZERS_PARALLELISM": "false", "XLA_FLAGS": "--a=1"}


def test_every_variable_is_in_the_module_docstring_table():
  for name in env.VARIABLES:
    assert name in env.__doc__, name


def _reads_environment(tree: ast.AST) -> list[int]:
  """Lines that touch ``os.environ`` / ``os.getenv`` / ``os.putenv``."""
  lines = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "os" and node.attr in ("environ", "getenv", "putenv")):
      lines.append(node.lineno)
    if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
        a.name in ("environ", "getenv") for a in node.names):
      lines.append(node.lineno)
  return lines


def test_no_other_module_reads_the_environment():
  offenders = {}
  for folder in ("heads_jax", "analyze", "train", "configs"):
    for path in sorted((REPO / folder).rglob("*.py")):
      if path == REPO / "heads_jax" / "env.py":
        continue
      lines = _reads_environment(ast.parse(path.read_text(), filename=str(path)))
      if lines:
        offenders[str(path.relative_to(REPO))] = lines
  assert not offenders, f"read environment variables through heads_jax.env: {offenders}"


def test_the_checker_finds_a_planted_read():
  assert _reads_environment(ast.parse("import os\nx = os.environ.get('A')\n")) == [2]
  assert _reads_environment(ast.parse("from os import getenv\n")) == [1]
  assert _reads_environment(ast.parse("import os\nx = os.path.join('a')\n")) == []


def test_bad_values_are_named_where_read_and_all_listed(tmp_path):
  from heads_jax.errors import UserError
  (tmp_path / "f").write_text("")
  bad = {"HEADS_JAX_STORAGE_TIMEOUT": "abc", "HEADS_JAX_STATS_IMPL": "bogus",
         "HEADS_JAX_CACHE_DIR": str(tmp_path / "f"), "JAX_PLATFORMS": "cpu,tpuu",
         "HF_HUB_OFFLINE": "maybe", "HEADS_JAX_STORAGE_PROGRESS": "-5"}
  with pytest.raises(UserError) as e:
    env.get("HEADS_JAX_STORAGE_TIMEOUT", bad)
  assert str(e.value) == ("environment: HEADS_JAX_STORAGE_TIMEOUT must be a positive number of "
                          "seconds (e.g. 300), got 'abc'")
  with pytest.raises(UserError, match="HEADS_JAX_STATS_IMPL must be one of layerwise, "
                                      "fused, stacked, kernel \\(or empty\\), got 'bogus'"):
    env.get("HEADS_JAX_STATS_IMPL", bad)
  assert env.check(bad) == [
      f"HEADS_JAX_CACHE_DIR={tmp_path / 'f'} is a file, not a directory: point it at a directory "
      f"or unset it, or set HEADS_JAX_CACHE_DIR=off",
      "HEADS_JAX_STORAGE_TIMEOUT must be a positive number of seconds (e.g. 300), got 'abc'",
      "HEADS_JAX_STORAGE_PROGRESS must be a positive number of seconds (e.g. 300), got '-5'",
      "HEADS_JAX_STATS_IMPL must be one of layerwise, fused, stacked, kernel (or empty), got 'bogus'",
      "JAX_PLATFORMS=cpu,tpuu names the unknown platform 'tpuu'; JAX takes a comma-separated "
      "list of cpu, cuda, gpu, rocm, tpu, metal",
      "HF_HUB_OFFLINE must be one of 1, 0, on, off, yes, no, true, false, none (or empty), got "
      "'maybe'"]
  with pytest.raises(UserError, match=r"^environment: HEADS_JAX_CACHE_DIR=.* \(and 5 more: "
                                      r"heads-jax doctor lists them\)$"):
    env.require_valid(bad)
  good = {"HEADS_JAX_STORAGE_TIMEOUT": "2.5", "HEADS_JAX_STATS_IMPL": "Fused",
          "HEADS_JAX_CACHE_DIR": "off", "JAX_PLATFORMS": "cuda,cpu", "HF_HUB_OFFLINE": "1",
          "HEADS_JAX_GLUE_DIR": str(tmp_path)}
  assert env.check(good, paths=True) == [] and env.get("HEADS_JAX_STORAGE_TIMEOUT", good) == "2.5"
  env.require_valid(good)
  assert env.check({"HEADS_JAX_GLUE_DIR": str(tmp_path / "no")}) == []  # existence: doctor only
  assert env.check({"HEADS_JAX_GLUE_DIR": str(tmp_path / "no")}, paths=True) == [
      f"HEADS_JAX_GLUE_DIR={tmp_path / 'no'}: no such directory; point it at one or unset it"]


def test_shared_data_defaults_beside_the_checkout_or_the_working_directory(tmp_path, monkeypatch):
  """The data defaults are ``shared/...`` beside the checkout, else beside the working directory;
  neither: the checkout's path, and ``missing_shared`` names the variable to set."""
  checkout_shared = Path(env.__file__).resolve().parents[2] / "shared"
  for name in ("HEADS_JAX_GLUE_DIR", "HEADS_JAX_SQUAD_FILE", "HEADS_JAX_GUTENBERG"):
    monkeypatch.delenv(name, raising=False)
    assert env.VARIABLES[name][0].startswith("../shared/data/")
    assert env.get(name).startswith(str(checkout_shared)) or \
        env.get(name).startswith(str(Path.cwd().resolve().parent / "shared"))
  work = tmp_path / "clone"
  (tmp_path / "shared" / "data" / "x").mkdir(parents=True)
  work.mkdir()
  if not (checkout_shared / "data" / "x").exists():
    assert env.shared_default("data/x", cwd=str(work)) == str(tmp_path / "shared" / "data" / "x")
  assert env.shared_default("data/none-such", cwd=str(work)) == str(checkout_shared / "data" / "none-such")
  monkeypatch.setenv("HEADS_JAX_GLUE_DIR", str(tmp_path / "nowhere"))
  assert env.missing_shared("HEADS_JAX_GLUE_DIR") == (
      f"HEADS_JAX_GLUE_DIR={tmp_path / 'nowhere'}: no such path; set HEADS_JAX_GLUE_DIR to your "
      "copy (README, 'Data and licences')")
  monkeypatch.setenv("HEADS_JAX_GLUE_DIR", str(tmp_path))
  assert env.missing_shared("HEADS_JAX_GLUE_DIR") is None


def test_no_absolute_path_of_a_developers_machine_in_code_configs_or_docs():
  """No ``/work/...``, ``/root/...`` or ``/home/...`` path in the package, configs, bench, scripts,
  docs or README (bench/results, raw outputs as other machines wrote them, aside): defaults are
  relative to the checkout (``env.shared_default``)."""
  root = Path(__file__).resolve().parents[1]
  pattern = re.compile(r"(?<![\w.~])/(work|root|home|Users)/[\w.-]+")
  files = [root / "README.md", root / "BENCHMARKS.md"]
  for folder in ("heads_jax", "configs", "bench", "scripts", "docs", "notebooks"):
    files += [p for p in (root / folder).rglob("*")
              if p.suffix in (".py", ".md", ".ipynb", ".cfg", ".toml", ".txt") and p.is_file()
              and "results" not in p.relative_to(root).parts]   # raw outputs of other machines
  found = [f"{p.relative_to(root)}:{i}: {m.group(0)}" for p in files
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
           for m in [pattern.search(line)] if m]
  assert found == [], "absolute machine paths:\n" + "\n".join(found)
