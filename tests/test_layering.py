"""The stage rule of docs/DESIGN.md section 2, checked on every module's imports.

Every ``import`` of every module of the package (heads_jax/, and train/, analyze/, configs/ as
installed: heads_jax.train, heads_jax.analyze, heads_jax.configs) is read with ``ast``, the
ones inside functions included. A module may import only from its own stage or a lower one:

    errors (+ xla_flags) < data (+ hub) < contract < sieves < model (+ parallel) < stats < hoststats < report
      < training (+ configs) < ablation < stages (the engine, the key rule, the stage names and
        the stage kinds the jobs compose: the analysis's two stages, the comparison's, the
        device pass) < jobs (the pipelines a user runs, doctor, the package facade
        heads_jax/__init__) < entry (cli, heads_jax.train, heads_jax.analyze)

and furthermore: no import cycles between modules, no library module imports an entry module or
``argparse``, and importing any hoststats/, report/ or contract module in a fresh interpreter
loads no jax. The checker itself is tested on a planted package (``test_checker_*``), so these
tests fail when the rule is broken.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Top-level package directories of the repository and the package they install as.
PACKAGE_DIRS = {"heads_jax": "heads_jax", "train": "heads_jax.train",
                "analyze": "heads_jax.analyze", "configs": "heads_jax.configs"}

# Stages, lowest first: (name, module prefixes). A module belongs to the stage of its longest
# matching prefix; a module of no stage fails test_every_module_has_a_stage. "heads_jax" (the
# package facade, heads_jax/__init__.py) matches only itself, so a new top-level module must be
# placed here explicitly.
STAGES = [
    ("errors", ("heads_jax.errors", "heads_jax.xla_flags", "heads_jax.env")),  # foundations: import no heads_jax module
    ("data", ("heads_jax.data", "heads_jax.hub", "heads_jax.storage", "heads_jax.early")),
    ("contract", ("heads_jax.contract", "heads_jax.runfiles")),
    ("sieves", ("heads_jax.sieves",)),
    ("model", ("heads_jax.model", "heads_jax.parallel")),
    ("stats", ("heads_jax.stats",)),
    ("hoststats", ("heads_jax.hoststats",)),
    ("report", ("heads_jax.report",)),
    ("training", ("heads_jax.training", "heads_jax.configs")),  # configs: training's presets
    ("ablation", ("heads_jax.ablation",)),
    # the parts every job composes: no stage contains a job (issue 42)
    ("stages", ("heads_jax.pipelines.engine", "heads_jax.pipelines.keys", "heads_jax.pipelines.names",
                "heads_jax.pipelines.stages", "heads_jax.pipelines.analysis",
                "heads_jax.pipelines.comparison", "heads_jax.pipelines.device_pass",
                "heads_jax.pipelines.robustness")),
    ("jobs", ("heads_jax.doctor", "heads_jax.pipelines", "heads_jax")),
    ("entry", ("heads_jax.cli", "heads_jax.__main__", "heads_jax.train", "heads_jax.analyze")),
]
ENTRY = "entry"
NO_JAX = ("heads_jax.hoststats", "heads_jax.report", "heads_jax.contract", "heads_jax.errors")
FORBIDDEN_IN_LIBRARY = ("argparse",)


def find_modules(root: Path, package_dirs: dict[str, str]) -> dict[str, Path]:
  """``{module name: file}`` of every ``.py`` file under the package directories."""
  modules = {}
  for folder, package in package_dirs.items():
    base = root / folder
    for path in sorted(base.rglob("*.py")):
      parts = list(path.relative_to(base).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      modules[".".join([package] + parts)] = path
  return modules


def _resolve(name: str, modules) -> str | None:
  """The module ``name`` refers to: itself, or its longest prefix that is a module of ours."""
  while name:
    if name in modules:
      return name
    name = name.rpartition(".")[0]
  return None


def imports_of(module: str, path: Path, modules) -> list[tuple[str, int, str]]:
  """``(target, line, imported name)`` for every import in ``path``: ``target`` is a module of
  ours (``from P import x`` counts as importing ``P.x`` when that is a module), or the external
  top-level name (``argparse``, ``jax``, ...)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        target = _resolve(alias.name, modules) or alias.name.split(".")[0]
        out.append((target, node.lineno, alias.name))
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
      for alias in node.names:
        full = f"{base}.{alias.name}"
        if full in modules:
          out.append((full, node.lineno, full))
        else:
          out.append((_resolve(base, modules) or base.split(".")[0], node.lineno, base))
  return out


EXACT_ONLY = ("heads_jax",)


def stage_of(module: str, stages=STAGES) -> str | None:
  best, best_len = None, -1
  for name, prefixes in stages:
    for p in prefixes:
      prefix_ok = p not in EXACT_ONLY and module.startswith(p + ".")
      if (module == p or prefix_ok) and len(p) > best_len:
        best, best_len = name, len(p)
  return best


def import_graph(modules) -> dict[str, list[tuple[str, int, str]]]:
  return {m: imports_of(m, p, modules) for m, p in modules.items()}


def stage_violations(graph, modules, stages=STAGES) -> list[str]:
  """Imports of a higher stage, of an entry module from the library, or of ``argparse`` in the
  library; one line each."""
  order = {name: i for i, (name, _) in enumerate(stages)}
  bad = []
  for m, imports in graph.items():
    s = stage_of(m, stages)
    for target, line, _ in imports:
      where = f"{modules[m].relative_to(modules[m].parents[len(m.split('.')) - 1])}:{line}"
      if target in modules:
        t = stage_of(target, stages)
        if s is None or t is None:
          continue  # reported by the stage-assignment test
        if order[t] > order[s]:
          what = "an entry module" if t == ENTRY else f"stage {t}"
          bad.append(f"{m} ({s}) imports {target} ({what}) at {where}")
      elif s != ENTRY and target in FORBIDDEN_IN_LIBRARY:
        bad.append(f"{m} ({s}) imports {target} at {where}: library code takes no flags")
  return bad


def cycles(graph, modules) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan), plus self-imports."""
  edges = {m: sorted({t for t, _, _ in imports if t in modules and t != m})
           for m, imports in graph.items()}
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def jax_loading(module_names, root: Path) -> list[str]:
  """The modules, among ``module_names``, after whose import (in one fresh interpreter, in
  order) jax is loaded; the first one named is the one that loads it."""
  code = ("import importlib, sys\n"
          "for name in sys.argv[1:]:\n"
          "  importlib.import_module(name)\n"
          "  if 'jax' in sys.modules or 'jaxlib' in sys.modules:\n"
          "    print(name)\n"
          "    break\n")
  res = subprocess.run([sys.executable, "-c", code, *module_names], cwd=root, capture_output=True,
                       text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  return res.stdout.split()


# ------------------------------------------------------------------------------------------------
# The repository

@pytest.fixture(scope="module")
def repo():
  modules = find_modules(REPO, PACKAGE_DIRS)
  return modules, import_graph(modules)


def test_every_module_has_a_stage(repo):
  modules, _ = repo
  assert len(modules) > 50
  assert [m for m in modules if stage_of(m) is None] == []
  assert stage_of("heads_jax.new_module") is None and stage_of("heads_jax") == "jobs"


def test_imports_follow_the_stage_order(repo):
  modules, graph = repo
  assert stage_violations(graph, modules) == []


def test_no_import_cycles(repo):
  modules, graph = repo
  assert cycles(graph, modules) == []


def test_hoststats_and_report_load_no_jax():
  modules = find_modules(REPO, PACKAGE_DIRS)
  names = [m for m in modules if any(m == p or m.startswith(p + ".") for p in NO_JAX)]
  assert len(names) > 10
  assert jax_loading(names, REPO) == []


# ------------------------------------------------------------------------------------------------
# The checker, on a planted package: each rule must catch its violation.

def _plant(tmp_path, files: dict[str, str]):
  for rel, text in files.items():
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
  modules = find_modules(tmp_path, {"heads_jax": "heads_jax", "analyze": "heads_jax.analyze"})
  return modules, import_graph(modules)


CLEAN = {
    "heads_jax/__init__.py": "",
    "heads_jax/errors.py": "class UserError(Exception): pass\n",
    "heads_jax/data/__init__.py": "",
    "heads_jax/data/text.py": "from heads_jax.errors import UserError\n",
    "heads_jax/model/__init__.py": "",
    "heads_jax/model/bert.py": "from heads_jax.data import text\nimport numpy\n",
    "heads_jax/hoststats/__init__.py": "",
    "heads_jax/hoststats/roles.py": "from ..data.text import UserError\n",
    "analyze/__init__.py": "",
    "analyze/heads.py": "import argparse\nfrom heads_jax.model import bert\n",
}


def test_checker_passes_a_clean_package(tmp_path):
  modules, graph = _plant(tmp_path, CLEAN)
  assert set(modules) >= {"heads_jax.data.text", "heads_jax.hoststats.roles", "heads_jax.analyze.heads"}
  assert stage_violations(graph, modules) == [] and cycles(graph, modules) == []
  # relative imports resolve to our modules
  assert ("heads_jax.data.text", 1, "heads_jax.data.text") in graph["heads_jax.hoststats.roles"]


def test_checker_catches_an_upward_import_inside_a_function(tmp_path):
  files = dict(CLEAN)
  files["heads_jax/data/text.py"] += "def f():\n  from heads_jax.model import bert\n"
  modules, graph = _plant(tmp_path, files)
  bad = stage_violations(graph, modules)
  assert len(bad) == 1 and "heads_jax.data.text (data) imports heads_jax.model.bert (stage model)" in bad[0]
  assert ":3" in bad[0]
  assert cycles(graph, modules) == [["heads_jax.data.text", "heads_jax.model.bert"]]


def test_checker_catches_entry_imports_and_argparse_in_the_library(tmp_path):
  files = dict(CLEAN)
  files["heads_jax/model/bert.py"] += "import argparse\nimport heads_jax.analyze.heads as h\n"
  modules, graph = _plant(tmp_path, files)
  bad = stage_violations(graph, modules)
  assert any("imports argparse" in b for b in bad)
  assert any("imports heads_jax.analyze.heads (an entry module)" in b for b in bad)


def test_checker_catches_a_cycle_within_a_stage(tmp_path):
  files = dict(CLEAN)
  files["heads_jax/hoststats/a.py"] = "from heads_jax.hoststats import b\n"
  files["heads_jax/hoststats/b.py"] = "import heads_jax.hoststats.a\n"
  modules, graph = _plant(tmp_path, files)
  assert stage_violations(graph, modules) == []
  assert cycles(graph, modules) == [["heads_jax.hoststats.a", "heads_jax.hoststats.b"]]


def test_checker_catches_a_module_that_loads_jax(tmp_path):
  files = {"heads_jax/__init__.py": "", "heads_jax/hoststats/__init__.py": "",
           "heads_jax/hoststats/fine.py": "import json\n",
           "heads_jax/hoststats/bad.py": "import numpy\nimport jax.numpy\n"}
  _plant(tmp_path, files)
  assert jax_loading(["heads_jax.hoststats.fine", "heads_jax.hoststats.bad"], tmp_path) == \
      ["heads_jax.hoststats.bad"]


# ------------------------------------------------------------------------------------------------
# Artefact file names: only their contract modules spell them (issue 22). The names are read from
# the contract modules themselves (module-level string constants that look like file names), so a
# file added to a contract is covered at once.

ARTEFACT_OWNERS = {
    "heads_jax.contract": "the files of an analysis directory",
    "heads_jax.runfiles": "the run-level files of the pipelines",
    "heads_jax.training.rundir": "the files of a training run directory",
}
_FILE_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*\.(npz|npy|json|jsonl|csv|html)$")
# Literals still outside their contract module, to be converted by the helper that owns the file
# (issue 22: pipelines/ by helper A, report/ by helper C). An entry here is tolerated; a new
# violation fails. Keep this list shrinking.
PENDING = {
    *((m, "report.html") for m in ("heads_jax.report.analysis",
                                   "heads_jax.report.compare", "heads_jax.report.index",
                                   "heads_jax.report.page", "heads_jax.report.reproduce")),
}


def artefact_names(modules) -> dict[str, str]:
  """``{file name: owning module}``: every module-level constant of an owner module (a string,
  or a tuple/list of strings) that looks like a file name."""
  names = {}
  for owner in ARTEFACT_OWNERS:
    if owner not in modules:
      continue
    tree = ast.parse(modules[owner].read_text())
    for node in tree.body:
      if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        continue
      values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
      for v in values:
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and _FILE_NAME.match(v.value):
          names[v.value] = owner
  return names


def artefact_literals(modules, names) -> list[tuple[str, int, str]]:
  """``(module, line, name)`` for every string literal equal to an artefact file name (or
  ending in ``/name``) outside the owner modules."""
  out = []
  for m, path in modules.items():
    if m in ARTEFACT_OWNERS:
      continue
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        hit = names.get(text) or next((n for n in names if text.endswith("/" + n)), None)
        if hit:
          out.append((m, node.lineno, text))
  return sorted(out)


def test_artefact_file_names_only_in_their_contract_modules(repo):
  modules, _ = repo
  names = artefact_names(modules)
  # the contract's own constants are found (the rule cannot pass by finding nothing)
  assert {"scores.npz", "measures.npz", "run.json", "tests.csv", "tests.json", "summary.json",
          "clusters.csv", "settings.json", "examples.json", "compare.json"} <= set(names)
  bad = [f"{m}:{line} spells {text!r} (use the constant of {names.get(text.rpartition('/')[2])})"
         for m, line, text in artefact_literals(modules, names) if (m, text) not in PENDING]
  assert bad == []


def test_checker_catches_an_artefact_file_name_outside_the_contract(tmp_path):
  files = {"heads_jax/__init__.py": "", "heads_jax/contract.py": 'TESTS_CSV = "tests.csv"\n'
           'TABLES = ("a.csv", "b.npz")\nPREFIX = "compare_"\n',
           "heads_jax/hoststats/__init__.py": "",
           "heads_jax/hoststats/ok.py": "from heads_jax import contract\n"
           "f = contract.TESTS_CSV\ndoc = 'see tests.csv'\n",
           "heads_jax/hoststats/bad.py": "import pandas as pd\n\ndef f(d):\n"
           "  return pd.read_csv(d / 'tests.csv'), 'out/b.npz'\n"}
  modules, _ = _plant(tmp_path, files)
  names = artefact_names(modules)
  assert names == {"tests.csv": "heads_jax.contract", "a.csv": "heads_jax.contract",
                   "b.npz": "heads_jax.contract"}
  assert artefact_literals(modules, names) == [("heads_jax.hoststats.bad", 4, "out/b.npz"),
                                               ("heads_jax.hoststats.bad", 4, "tests.csv")]


# ------------------------------------------------------------------------------------------------
# Role names: only the role registry spells them (heads_jax/data/vocabulary.py). The names that
# mean nothing but a role are checked (``local``, ``block``, ``cls``, ``sep``, ``obj`` are also
# coarse roles, token measures or distance features, and are left to review).

REGISTRY_MODULE = "heads_jax.data.vocabulary"
# Literals still outside the registry, in files other helpers own (issue 22); keep it shrinking.
PENDING_ROLE_NAMES = {
    ("heads_jax.report.analysis", "block_plain"),
    ("heads_jax.report.reproduce", "nsubj"), ("heads_jax.report.reproduce", "next_local"),
    ("heads_jax.report.reproduce", "prev_local"),
}


def distinctive_role_names() -> set[str]:
  from heads_jax.data import vocabulary
  ambiguous = set(vocabulary.COARSE_GROUPS) | {"cls", "sep", "obj"}
  return set(vocabulary.ROLES) - ambiguous


def role_name_literals(modules, names) -> list[tuple[str, int, str]]:
  out = []
  for m, path in modules.items():
    if m == REGISTRY_MODULE:
      continue
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
        out.append((m, node.lineno, node.value))
  return sorted(out)


def test_role_names_only_in_the_registry(repo):
  modules, _ = repo
  names = distinctive_role_names()
  assert {"prev_local", "next_local", "block_plain", "nsubj", "amod", "advmod"} <= names
  bad = [f"{m}:{line} spells the role {text!r} (read heads_jax.data.vocabulary's registry)"
         for m, line, text in role_name_literals(modules, names)
         if (m, text) not in PENDING_ROLE_NAMES]
  assert bad == []


def test_checker_catches_a_role_name_outside_the_registry(tmp_path):
  files = {"heads_jax/__init__.py": "", "heads_jax/data/__init__.py": "",
           "heads_jax/data/vocabulary.py": 'ROLES = ("prev_local",)\n',
           "heads_jax/report/__init__.py": "",
           "heads_jax/report/style.py": 'COLORS = {"prev_local": "#000"}\nDOC = "prev_local heads"\n'}
  modules, _ = _plant(tmp_path, files)
  assert role_name_literals(modules, {"prev_local"}) == [("heads_jax.report.style", 1, "prev_local")]
