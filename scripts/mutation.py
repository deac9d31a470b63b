"""Mutation testing of the scoring core: does the test suite notice when the code is wrong?

A small AST mutator (no dependency): for each target module it lists every mutant of these
kinds, then runs the tests that cover the module against each mutant, one at a time, in a
private copy of the repository (the working tree is never modified):

* arithmetic ``+ -``, ``* /``, ``// -> /``, ``** -> *``; bitwise ``& |`` (jnp masks);
* comparisons ``< <=``, ``> >=``, ``== !=``, ``is / is not``, ``in / not in``;
* numbers ``n -> n + 1``; ``True / False``;
* dropped ``not``, unary minus and ``~``; ``and / or``.

Docstrings, strings, f-strings and annotations are left alone; a line ending in
``# pragma: no mutate`` too. A mutant is *killed* when the tests fail (or time out), *survived*
when they pass. The mutation score is killed / all. Survivors are printed with their line so
that each can be killed by a test or written down as equivalent (docs/TESTING.md).

    python scripts/mutation.py --list                       # the mutants, nothing run
    python scripts/mutation.py sieves pruning               # some targets (names below)
    python scripts/mutation.py --before sieves              # with the tests of before issue 19
    python scripts/mutation.py --max-mutants 40 --seed 1    # a reproducible sample per target
    python scripts/mutation.py --json out.json              # every result, for the record

Runs are serial and CPU-bound (JAX compiles): a few minutes for a host module, up to an hour
for a JAX module on 2 cores (a persistent XLA cache in the sandbox helps from the second
mutant on). Not part of CI.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# target -> (module path, tests before issue 19, tests after it). Fast tests first: -x stops at
# the first failure, so the first files decide most mutants.
TARGETS = {
    "sieves": ("heads_jax/sieves.py",
               ["tests/test_sieves.py", "tests/stats/test_sieve_bias.py"],
               ["tests/test_sieves.py", "tests/stats/test_sieve_bias.py", "tests/properties/test_properties.py"]),
    "sieve_bias": ("heads_jax/stats/sieve_bias.py",
                   ["tests/stats/test_sieve_bias.py"],
                   ["tests/stats/test_sieve_bias.py", "tests/properties/test_properties.py"]),
    "distance": ("heads_jax/stats/distance.py",
                 ["tests/stats/test_sieve_bias.py"],
                 ["tests/stats/test_sieve_bias.py", "tests/properties/test_mutation_kills.py", "tests/properties/test_properties.py"]),
    "hypothesis": ("heads_jax/hoststats/hypothesis.py",
                   ["tests/hoststats/test_hypothesis.py"],
                   ["tests/hoststats/test_hypothesis.py", "tests/properties/test_mutation_kills.py"]),
    "roles": ("heads_jax/hoststats/roles.py",   # (tests/hoststats/test_calibration.py also covers it: 1 min)
              ["tests/hoststats/test_roles.py"],
              ["tests/hoststats/test_roles.py", "tests/properties/test_mutation_kills.py"]),
    "pruning": ("heads_jax/ablation/pruning.py",
                ["tests/ablation/test_ablation.py::test_pruning_counts", "tests/ablation/test_ablation.py::test_pruning_curve"],
                ["tests/ablation/test_pruning.py", "tests/ablation/test_ablation.py::test_pruning_curve"]),
}

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Div, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
        ast.NotIn: ast.In}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
_UNARY = (ast.Not, ast.USub, ast.Invert)


def _skipped_nodes(tree: ast.AST) -> set[int]:
  """ids of nodes never mutated: docstrings, f-strings, annotations (and everything under them)."""
  skip = set()

  def under(node):
    for n in ast.walk(node):
      skip.add(id(n))

  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        under(body[0])
    if isinstance(node, ast.JoinedStr):
      under(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if node.returns is not None:
        under(node.returns)
      for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
        if a.annotation is not None:
          under(a.annotation)
    if isinstance(node, ast.AnnAssign):
      under(node.annotation)
  return skip


def _sites(tree: ast.AST, lines: list[str]):
  """(walk index, kind, detail) of every mutation site, in a stable order."""
  skip = _skipped_nodes(tree)
  out = []
  for i, node in enumerate(ast.walk(tree)):
    if id(node) in skip:
      continue
    line = getattr(node, "lineno", None)
    if line is not None and lines[line - 1].rstrip().endswith("# pragma: no mutate"):
      continue
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
      out.append((i, "binop", 0))
    elif isinstance(node, ast.Compare):
      for j, op in enumerate(node.ops):
        if type(op) in _CMP:
          out.append((i, "cmp", j))
    elif isinstance(node, ast.BoolOp):
      out.append((i, "bool", 0))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY):
      out.append((i, "unary", 0))
    elif isinstance(node, ast.Constant):
      if isinstance(node.value, bool):
        out.append((i, "bool_const", 0))
      elif isinstance(node.value, (int, float)):
        out.append((i, "number", 0))
  return out


class _Apply(ast.NodeTransformer):
  def __init__(self, index, kind, detail):
    self.index, self.kind, self.detail = index, kind, detail
    self.before = self.after = None
    self.line = None

  def run(self, tree):
    nodes = list(ast.walk(tree))
    target = nodes[self.index]
    self.line = target.lineno
    self.before = ast.unparse(target)
    new = self._mutate(target)
    self.after = ast.unparse(new)
    return self._replace(tree, target, new)

  def _mutate(self, node):
    k = self.kind
    if k == "binop":
      node.op = _BINOP[type(node.op)]()
    elif k == "cmp":
      node.ops[self.detail] = _CMP[type(node.ops[self.detail])]()
    elif k == "bool":
      node.op = _BOOL[type(node.op)]()
    elif k == "unary":
      return node.operand
    elif k == "bool_const":
      node.value = not node.value
    elif k == "number":
      node.value = node.value + 1
    return node

  @staticmethod
  def _replace(tree, old, new):
    if old is new:
      return tree
    for parent in ast.walk(tree):
      for field, value in ast.iter_fields(parent):
        if value is old:
          setattr(parent, field, new)
          return tree
        if isinstance(value, list):
          for j, v in enumerate(value):
            if v is old:
              value[j] = new
              return tree
    raise RuntimeError("mutation site not found")


def mutants(path: Path):
  """[(description dict, mutated source)] of one module."""
  source = path.read_text()
  lines = source.splitlines()
  out = []
  for index, kind, detail in _sites(ast.parse(source), lines):
    tree = ast.parse(source)
    m = _Apply(index, kind, detail)
    tree = ast.fix_missing_locations(m.run(tree))
    mutated = ast.unparse(tree)
    if mutated == ast.unparse(ast.parse(source)):
      continue
    out.append(({"line": m.line, "kind": kind, "before": m.before, "after": m.after,
                 "code": lines[m.line - 1].strip()}, mutated))
  return out


def make_sandbox(root: Path) -> Path:
  """A copy of the working tree (no .git) with ../shared beside it and the entry packages
  linked into heads_jax/ (the editable install maps them from the top of the repository)."""
  repo = root / "main"
  shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info",
                                                            ".pytest_cache", ".hypothesis"))
  shared = REPO.parent / "shared"
  if shared.exists():
    (root / "shared").symlink_to(shared)
  for name, target in (("train", "train"), ("analyze", "analyze"), ("configs", "configs")):
    link = repo / "heads_jax" / name
    if not link.exists():
      link.symlink_to(Path("..") / target)
  return repo


def run_tests(repo: Path, tests: list[str], timeout: float, cache: Path) -> tuple[str, float]:
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", HYPOTHESIS_DATABASE="none")
  env.pop("PYTHONPATH", None)
  cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         *tests]
  t0 = time.time()
  try:
    rc = subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, timeout=timeout).returncode
  except subprocess.TimeoutExpired:
    return "timeout", time.time() - t0
  return ("survived" if rc == 0 else "killed"), time.time() - t0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("targets", nargs="*", help=f"targets (default all): {', '.join(TARGETS)}")
  p.add_argument("--before", action="store_true", help="run the tests from before issue 19")
  p.add_argument("--list", action="store_true", help="list the mutants and stop")
  p.add_argument("--max-mutants", type=int, default=0, help="a seeded sample per target (0: all)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--lines", default="", help="only mutants on these lines, e.g. 40-80,95")
  p.add_argument("--json", default="", help="write every result to this file")
  p.add_argument("--survivors-of", default="", metavar="JSON",
                 help="run only the mutants that survived in an earlier --json file (e.g. of a "
                      "--before run) and report the combined score over that file's mutants")
  p.add_argument("--keep", action="store_true", help="keep the sandbox")
  args = p.parse_args(argv)
  names = args.targets or list(TARGETS)
  unknown = [n for n in names if n not in TARGETS]
  if unknown:
    print(f"mutation.py: error: unknown target(s) {unknown}; choose from {', '.join(TARGETS)}",
          file=sys.stderr)
    return 2
  wanted = set()
  for part in filter(None, args.lines.split(",")):
    a, _, b = part.partition("-")
    wanted.update(range(int(a), int(b or a) + 1))

  previous = json.loads(Path(args.survivors_of).read_text()) if args.survivors_of else None
  if previous is not None:
    names = [n for n in names if n in previous]
  plan = {}
  for name in names:
    path, before, after = TARGETS[name]
    ms = mutants(REPO / path)
    if wanted:
      ms = [m for m in ms if m[0]["line"] in wanted]
    if previous is not None:
      alive = {}  # (line, before, after) -> how many such mutants survived
      for r in previous[name]["results"]:
        if r["status"] == "survived":
          key = (r["line"], r["before"], r["after"])
          alive[key] = alive.get(key, 0) + 1
      picked = []
      for m in ms:
        key = (m[0]["line"], m[0]["before"], m[0]["after"])
        if alive.get(key, 0) > 0:
          alive[key] -= 1
          picked.append(m)
      ms = picked
    elif args.max_mutants and len(ms) > args.max_mutants:
      ms = random.Random(args.seed).sample(ms, args.max_mutants)
      ms.sort(key=lambda m: m[0]["line"])
    plan[name] = (path, before if args.before else after, ms)
    if args.list:
      for d, _ in ms:
        print(f"{path}:{d['line']}: {d['before']}  ->  {d['after']}")
  if args.list:
    return 0

  root = Path(tempfile.mkdtemp(prefix="heads_jax_mutation_"))
  results = {}
  try:
    repo = make_sandbox(root)
    cache = root / "xla_cache"
    for name, (path, tests, ms) in plan.items():
      missing = [t for t in tests if not (repo / t.split("::")[0]).exists()]
      if missing:
        print(f"{name}: test file(s) {missing} not found", file=sys.stderr)
        return 2
      original = (repo / path).read_text()
      status, base = run_tests(repo, tests, 3600, cache)
      if status != "survived":
        print(f"{name}: the tests fail on the unmutated code ({status}); fix that first",
              file=sys.stderr)
        return 1
      timeout = max(60.0, 3 * base)
      print(f"{name}: {len(ms)} mutants of {path}; tests {' '.join(tests)} ({base:.0f} s)",
            flush=True)
      rows = []
      try:
        for k, (desc, source) in enumerate(ms, 1):
          (repo / path).write_text(source)
          status, secs = run_tests(repo, tests, timeout, cache)
          rows.append(dict(desc, status=status, seconds=round(secs, 1)))
          if status == "survived":
            print(f"  [{k}/{len(ms)}] SURVIVED {path}:{desc['line']}: {desc['before']}  ->  "
                  f"{desc['after']}    | {desc['code']}", flush=True)
      finally:
        (repo / path).write_text(original)
      if previous is not None:  # the earlier run's killed mutants stay killed (more tests now)
        rows = [r for r in previous[name]["results"] if r["status"] != "survived"] + rows
      killed = sum(r["status"] != "survived" for r in rows)
      score = killed / len(rows) if rows else float("nan")
      results[name] = {"module": path, "tests": tests, "mutants": len(rows), "killed": killed,
                       "score": round(score, 3), "results": rows}
      print(f"{name}: score {killed}/{len(rows)} = {score:.1%}", flush=True)
  finally:
    if args.keep:
      print(f"sandbox kept in {root}")
    else:
      shutil.rmtree(root, ignore_errors=True)
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1))
  print("\nsummary (killed / mutants):")
  for name, r in results.items():
    print(f"  {name:11s} {r['killed']:4d} / {r['mutants']:4d}  {r['score']:.1%}  {r['module']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
