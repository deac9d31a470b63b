"""heads_jax/env.py: the one module that reads environment variables, and the only one."""

from __future__ import annotations

import ast
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
