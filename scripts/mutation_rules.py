"""Mutation check of the verdict rules (issue 41 item 5): do the rule tests notice a wrong rule?

The target is the rule code of the package `heads_jax/hoststats/claims/`: every check (the
functions of `pande_checks` and `guan_checks`), the number judge (`judging`), the comparability
and majority-class gates and the layer scaling (`run`), the bars (`STABLE_BAR`, `FIG2_GAP`,
`ALPHA` in `claim`), the three-valued judges of a share against its bar or base rate (`bars`)
and the claims' tolerances (`pande`, `guan`). The mutants, as the issue asks:

* *turned*: a comparison reversed (``<`` -> ``>``, ``<=`` -> ``>=``, ``>`` -> ``<``, ``>=`` ->
  ``<=``, ``==`` <-> ``!=``);
* *doubled* / *halved*: a number inside a comparison (a threshold), a bar or a tolerance, times
  2 and times 1/2 (0 has neither);
* *swapped*: a conjunction swapped (``and`` <-> ``or``, ``&`` <-> ``|``, ``all`` <-> ``any``).

Also reported, apart from the score the issue sets (90%): *boundary* mutants (``<`` <-> ``<=``,
``>`` <-> ``>=``), which only a pair exactly at a bar can kill.

Each mutant is one module's source with one change (`ast`), executed into the live module; the
package's modules that come after it (`MODULES`, in import order) and the package itself are
then reloaded, so that the names they import and the tuples they build (``CLAIMS``) are the
mutant's, and the tests, which call ``claims.evaluate``, see it. The rule tests
(tests/hoststats/test_paper_rules.py and test_paper.py, called in-process: no pytest run per
mutant) then run until one fails (*killed*) or all pass (*survived*). The module and its
dependents are restored after each mutant. Survivors are printed with their line, to be killed by a test or written down
as equivalent.

    python scripts/mutation_rules.py                 # every mutant; the kill rate
    python scripts/mutation_rules.py --list          # the mutants, nothing run
    python scripts/mutation_rules.py --kinds turned swapped --json out.json
    python scripts/mutation_rules.py --modules judging run   # some modules of the package
    python scripts/mutation_rules.py --target clustering     # hoststats/clustering.py

``--target clustering`` (issue 48 item 5) mutates `heads_jax/hoststats/clustering.py` the same way:
every function (the masses, the reference, the naming and its gate, the outlier rules, the
stability), its thresholds (`CLUSTERING_CONSTANTS`: doubled and halved), and *switched* mutants
that turn the unnaming off (`CLUSTERING_SWITCHES`: no type unnamed by a failed condition between
types; none by a failed condition against the reference); the tests are
tests/hoststats/test_clustering.py's (parametrised ones once per case), in-process, each mutant
within ``TIME_LIMIT`` (a refit loop that never stops is killed). Measured (issue 48, 2 shared
cores, three runs joined with ``--survivors-of`` as tests were added): the issue's mutants 94 of
99 killed (94.9%). The 5 survivors are equivalent: ``x.size > 1`` -> ``> 0.5`` and ``fits < 1``,
``k < 1`` -> ``< 0.5`` (integers), and ``&`` -> ``|`` / ``==`` -> ``!=`` inside the
``.any()`` guard of a cluster's members (the guard only picks all of a cluster's heads when it
has no member left, which the outlier rules never allow).

Runs serially on the host (no jax); not part of CI. Measured on the claims package (2026-11-29,
code of 49e942d, 2 shared cores at load 15-18, 509 s for the 309 mutants): the issue's mutants
232 of 237 killed (97.9%; per module: claim 7/7, pande 4/4, run 8/9, bars 12/12, pande_checks
110/111, guan_checks 64/67, judging 27/27); boundary mutants 40 of 72 (55.6%: the three-valued
bars' `<` vs `<=` at a p-value or an interval bound, which only a pair exactly at 0.05 or at a
Wilson bound can kill). The 5 surviving issue mutants change no verdict: ``any -> all`` over the names of one
clustering, which are either all "cluster j" (k != 4) or none; ``any -> all`` in an error
message's wording; ``cluster_info or {}`` and ``stability_fits or 10`` -> ``and`` (the k = 3 / 5
refit then runs with the default restarts and fits, same verdicts on the tests' data); ``1 in
em`` -> ``2 in em`` (Tables 2-3 always hold rows 1 and 2). DESIGN.md section 3 ("Verdicts")
gives the figure.
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PACKAGE = "heads_jax.hoststats.claims"
# The package's modules in import order (each imports only from those before it).
MODULES = ("claim", "devlin", "pande", "guan", "run", "bars", "pande_checks", "guan_checks",
           "judging")
# The rule code of the package (module docstring).
RULE_FUNCTIONS = (
    "_from_summary", "_average_vs_test", "_fine_overlap", "_delimiter_intersect",
    "_multi_functional", "_block_marginal", "_multi_skilled_middle", "_multi_skilled_qqp_early",
    "_delimiter_all_layers", "_delimiter_only_last_three", "_delimiter_layer0_few",
    "_block_layer0", "_block_layers_1_4", "_block_qqp", "_qnli_layer7", "_block_mrpc_all",
    "_syntactic_every_layer", "_syntactic_layers_6_8", "_last_two_few", "_change",
    "_finetune_final", "_finetune_sep_not_cls", "_finetune_stable", "_finetune_delimiter_heads",
    "_finetune_at_par", "_half", "_cluster_layers", "_stability_over_95", "_cluster_similar",
    "_cluster_kept", "_stable_3_5", "_squad_row", "_squad_statement", "_judge_number",
    "bert_base_layers", "pande_setting", "unnamed_types", "need_types", "beats_majority",
    "_one_sided_two_proportions", "evaluate", "wilson_interval", "_mass_change", "change_pairs",
    "share_verdict", "_decide", "overlap_verdict", "multi_rate", "multi_verdict",
    "hypergeometric_tails", "union", "_overlap_table", "_overlap_result", "_other_coarse",
    "_coarse_role")
RULE_CONSTANTS = ("STABLE_BAR", "FIG2_GAP", "ALPHA")
KINDS = ("turned", "doubled", "halved", "swapped", "switched", "boundary")
SCORED = ("turned", "doubled", "halved", "swapped", "switched")   # the mutants

# --target clustering: the module, its thresholds, the unnaming switches (function, the
# variable whose assignment is replaced, the replacement) and the tests (module docstring).
CLUSTERING = "heads_jax.hoststats.clustering"
CLUSTERING_CONSTANTS = ("MIN_SHARE", "OUTLIER_FENCE", "MAX_REFITS", "NEAR_TOKENS", "NEAR_LIFT",
                        "FAR_LIFT", "SPECIAL_LIFT", "LOW_MARGIN", "SPREAD_FLOOR")
CLUSTERING_SWITCHES = (("name_types", "more", "set()"), ("name_types", "unnamed", "set()"))
CLUSTERING_TESTS = ("tests.hoststats.test_clustering",)
TIME_LIMIT = 300   # seconds of tests per mutant (all of them take about a minute on 2 cores)
# the clustering tests that fit t-SNE or many stability halves: run last

_TURN = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _is_number(node) -> bool:
  """A threshold: a number other than 0 (which doubling and halving leave alone) and other than
  a float tolerance below 1e-6 (1e-9, 1e-12: the slack of an exact comparison, not a bar)."""
  return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
          and not isinstance(node.value, bool) and node.value != 0 and abs(node.value) >= 1e-6)


def _skipped(tree) -> set[int]:
  """ids of nodes never mutated: f-strings, subscripts' slices (indices, not thresholds), type
  annotations (``X | None``), and ``text or "none"`` (a detail's words, not a rule)."""
  skip = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):
      skip |= {id(n) for n in ast.walk(node)}
    if isinstance(node, ast.Subscript):
      skip |= {id(n) for n in ast.walk(node.slice)}
    if isinstance(node, ast.FunctionDef):
      for ann in [node.returns] + [a.annotation for a in node.args.args + node.args.kwonlyargs]:
        if ann is not None:
          skip |= {id(n) for n in ast.walk(ann)}
    if isinstance(node, ast.BoolOp) and any(
        isinstance(v, ast.Constant) and isinstance(v.value, str) for v in node.values):
      skip.add(id(node))
  return skip


def sites(tree, functions=None, constants=None, switches=()) -> list[dict]:
  """Every mutation site of the rule code: ``{kind, path, line, what}`` (path: the node's
  position in `ast.walk` order, stable for one source). ``functions`` / ``constants``: the
  rule functions (None: all top-level ones) and constants (default: the claims'); ``switches``:
  ``(function, variable, replacement)`` whose assignments are replaced (*switched*)."""
  functions = RULE_FUNCTIONS if functions is None and constants is None else functions
  constants = RULE_CONSTANTS if constants is None else constants
  skip = _skipped(tree)
  nodes = list(ast.walk(tree))
  index = {id(n): i for i, n in enumerate(nodes)}
  out = []

  def add(kind, node, what):
    out.append({"kind": kind, "path": index[id(node)], "line": node.lineno, "what": what})

  def in_rules(node_list):
    for node in node_list:
      if id(node) in skip:
        continue
      if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
          if type(op) in _TURN:
            add("turned", node, f"{_SYMBOL[type(op)]} -> {_SYMBOL[_TURN[type(op)]]} (#{i})")
          if type(op) in _BOUNDARY:
            add("boundary", node, f"{_SYMBOL[type(op)]} -> {_SYMBOL[_BOUNDARY[type(op)]]} (#{i})")
        for sub in ast.walk(node):
          if _is_number(sub) and id(sub) not in skip:
            add("doubled", sub, f"{sub.value!r} -> {sub.value * 2!r}")
            add("halved", sub, f"{sub.value!r} -> {sub.value / 2!r}")
      elif isinstance(node, ast.BoolOp):
        add("swapped", node, "and -> or" if isinstance(node.op, ast.And) else "or -> and")
      elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        add("swapped", node, "& -> |" if isinstance(node.op, ast.BitAnd) else "| -> &")
      elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("all", "any")):
        add("swapped", node, f"{node.func.id} -> {'any' if node.func.id == 'all' else 'all'}")

  for top in tree.body:
    if isinstance(top, ast.FunctionDef) and (functions is None or top.name in functions):
      in_rules(list(ast.walk(top)))
      for fn, var, repl in switches:
        if fn == top.name:
          for node in ast.walk(top):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == var):
              add("switched", node.value, f"{var} = {repl}")
    elif (isinstance(top, ast.Assign) and len(top.targets) == 1
          and isinstance(top.targets[0], ast.Name) and top.targets[0].id in constants
          and _is_number(top.value)):
      add("doubled", top.value, f"{top.targets[0].id} {top.value.value!r} -> x2")
      add("halved", top.value, f"{top.targets[0].id} {top.value.value!r} -> x1/2")
  # the claims' tolerances (Claim(..., tolerance=x))
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == "tolerance" and _is_number(node.value):
      add("doubled", node.value, f"tolerance {node.value.value!r} -> x2")
      add("halved", node.value, f"tolerance {node.value.value!r} -> x1/2")
  return out


def mutate(tree, site: dict) -> ast.AST:
  """A copy of ``tree`` with the one change of ``site``."""
  new = copy.deepcopy(tree)
  node = list(ast.walk(new))[site["path"]]
  kind = site["kind"]
  if kind in ("turned", "boundary"):
    i = int(site["what"].split("#")[1].rstrip(")"))
    table = _TURN if kind == "turned" else _BOUNDARY
    node.ops[i] = table[type(node.ops[i])]()
  elif kind in ("doubled", "halved"):
    node.value = node.value * 2 if kind == "doubled" else node.value / 2
  elif kind == "switched":
    parent = next(p for p in ast.walk(new) if isinstance(p, ast.Assign) and p.value is node)
    parent.value = ast.parse(site["what"].split(" = ", 1)[1], mode="eval").body
  elif isinstance(node, ast.BoolOp):
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
  elif isinstance(node, ast.BinOp):
    node.op = ast.BitOr() if isinstance(node.op, ast.BitAnd) else ast.BitAnd()
  else:
    node.func.id = "any" if node.func.id == "all" else "all"
  return ast.fix_missing_locations(new)


def path_of(module: str) -> Path:
  return REPO / "heads_jax" / "hoststats" / "claims" / f"{module}.py"


def load(module: str, tree) -> None:
  """Executes ``tree`` as the live module ``module`` of the package, then reloads the package's
  modules after it and the package (their imports and built tuples follow)."""
  import importlib
  live = importlib.import_module(f"{PACKAGE}.{module}")
  exec(compile(tree, str(path_of(module)), "exec"), live.__dict__)
  for later in MODULES[MODULES.index(module) + 1:]:
    importlib.reload(importlib.import_module(f"{PACKAGE}.{later}"))
  importlib.reload(importlib.import_module(PACKAGE))


def rule_tests() -> list[tuple[str, callable]]:
  """The rule tests, called in-process: every test function of the two test modules that
  takes no fixture, and test_rule_holds_and_fails once per claim."""
  import importlib
  out = []
  for name in ("tests.hoststats.test_paper_rules", "tests.hoststats.test_paper"):
    mod = importlib.import_module(name)
    for fname, fn in vars(mod).items():
      if not fname.startswith("test_") or not callable(fn):
        continue
      params = inspect.signature(fn).parameters
      if fname == "test_rule_holds_and_fails":
        out += [(f"{name}::{fname}[{k}]", (lambda fn=fn, k=k: fn(k))) for k in sorted(mod.PAIRS)]
      elif not params:
        out.append((f"{name}::{fname}", fn))
  # cheap tests first: the ones that run a clustering last
  out.sort(key=lambda t: ("stable_3_5" in t[0] or "every_claim_is_evaluated" in t[0]))
  return out


def clustering_tests() -> list[tuple[str, callable]]:
  """tests/hoststats/test_clustering.py called in-process: every test without a fixture, a
  parametrised one once per case; the slow ones (t-SNE, many fits) last."""
  import importlib
  out = []
  for name in CLUSTERING_TESTS:
    mod = importlib.import_module(name)
    for fname, fn in vars(mod).items():
      if not fname.startswith("test_") or not callable(fn):
        continue
      marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
      params = inspect.signature(fn).parameters
      if marks:
        argnames, values = marks[0].args[0], marks[0].args[1]
        names = [a.strip() for a in argnames.split(",")] if isinstance(argnames, str) else argnames
        for v in values:
          v = v if len(names) > 1 else (v,)
          out.append((f"{name}::{fname}[{v}]", (lambda fn=fn, kw=dict(zip(names, v)): fn(**kw))))
      elif not params:
        out.append((f"{name}::{fname}", fn))
  slow = ("tsne", "stability_on_real", "extreme_heads")
  out.sort(key=lambda t: any(w in t[0] for w in slow))
  return out


# The one slow rule test (it clusters: k = 3 and 5, 5 half-sample fits each) reads only these of
# paper.py's rule code; it runs for the mutants in them and is skipped for the others, whose
# change cannot reach it.
SLOW = "test_rule_holds_and_fails[guan_stable_3_5]"
SLOW_REACH = ("_stable_3_5", "evaluate", "task_analyses") + RULE_CONSTANTS


def function_of(tree, line: int) -> str:
  """The top-level function or constant of ``tree`` that holds ``line``."""
  for top in tree.body:
    if top.lineno <= line <= top.end_lineno:
      if isinstance(top, ast.FunctionDef):
        return top.name
      if isinstance(top, ast.Assign) and isinstance(top.targets[0], ast.Name):
        return top.targets[0].id
  return ""


def run_tests(tests, slow: bool = True) -> str | None:
  """The first failing test's name, or None when all pass (``slow``: run `SLOW` too)."""
  import warnings
  for name, fn in tests:
    if not slow and name.endswith(SLOW):
      continue
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    except BaseException as e:  # noqa: BLE001 - any failure kills the mutant
      if isinstance(e, KeyboardInterrupt):
        raise
      return name
  return None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
  p.add_argument("--target", choices=("claims", "clustering"), default="claims",
                 help="the claims package (default) or hoststats/clustering.py")
  p.add_argument("--modules", nargs="+", choices=MODULES, default=list(MODULES))
  p.add_argument("--survivors-of", metavar="JSON",
                 help="--target clustering: skip the mutants an earlier --json file of the same "
                      "source killed (a run stopped early or with fewer tests) and report the "
                      "combined score")
  p.add_argument("--list", action="store_true", help="list the mutants and exit")
  p.add_argument("--json", help="write every result to this file")
  args = p.parse_args(argv)
  plan = []   # (module, tree, source, site)
  if args.target == "clustering":
    return main_clustering(args)
  for module in args.modules:
    source = path_of(module).read_text()
    tree = ast.parse(source)
    plan += [(module, tree, source, s) for s in sites(tree) if s["kind"] in args.kinds]
  if args.list:
    for module, _, _, s in plan:
      print(f"{s['kind']:9s} {module}.py line {s['line']:5d}  {s['what']}")
    print(f"{len(plan)} mutants")
    return 0
  tests = rule_tests()
  if run_tests(tests) is not None:
    print(f"the rule tests fail on the unmutated package ({run_tests(tests)}): fix them first")
    return 2
  results, start = [], time.time()
  for i, (module, tree, source, s) in enumerate(plan, 1):
    try:
      load(module, mutate(tree, s))
      killer = run_tests(tests, slow=function_of(tree, s["line"]) in SLOW_REACH)
    except Exception:  # noqa: BLE001 - a mutant that does not even load is killed
      killer = "load: " + traceback.format_exc(limit=1).splitlines()[-1]
    finally:
      load(module, tree)
    results.append({**s, "module": module, "killed": killer is not None, "by": killer})
    mark = "killed" if killer else "SURVIVED"
    print(f"[{i}/{len(plan)}] {mark:8s} {s['kind']:9s} {module}.py line {s['line']:5d} {s['what']}",
          flush=True)
  print(f"\n{len(results)} mutants in {time.time() - start:.0f} s")
  for kinds, label in ((SCORED, "the issue's mutants (turned, doubled, halved, swapped)"),
                       (("boundary",), "boundary mutants (< vs <=, > vs >=)")):
    part = [r for r in results if r["kind"] in kinds]
    if part:
      k = sum(r["killed"] for r in part)
      print(f"{label}: {k} of {len(part)} killed = {100 * k / len(part):.1f}%")
      for module in args.modules:
        mine = [r for r in part if r["module"] == module]
        if mine:
          k = sum(r["killed"] for r in mine)
          print(f"  {module + '.py':17s} {k:4d} of {len(mine):4d} = {100 * k / len(mine):.1f}%")
  survivors = [r for r in results if not r["killed"]]
  if survivors:
    print("\nsurvivors:")
    sources = {m: src for m, _, src, _ in plan}
    for r in survivors:
      line = sources[r["module"]].splitlines()[r["line"] - 1].strip()
      print(f"  {r['kind']:9s} {r['module']}.py line {r['line']:5d} {r['what']:30s} | {line}")
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1))
  return 0


def main_clustering(args) -> int:
  """``--target clustering``: the mutants of hoststats/clustering.py against its tests."""
  import importlib
  path = REPO / "heads_jax" / "hoststats" / "clustering.py"
  source = path.read_text()
  tree = ast.parse(source)
  plan = [s for s in sites(tree, None, CLUSTERING_CONSTANTS, CLUSTERING_SWITCHES)
          if s["kind"] in args.kinds]
  earlier = []
  if args.survivors_of:   # the earlier run's killed mutants stay killed (more tests now)
    earlier = json.loads(Path(args.survivors_of).read_text())
    done = {(r["kind"], r["line"], r["what"]) for r in earlier if r["killed"]}
    earlier = [r for r in earlier if r["killed"] and r["kind"] in args.kinds]
    plan = [s for s in plan if (s["kind"], s["line"], s["what"]) not in done]
  if args.list:
    for s in plan:
      print(f"{s['kind']:9s} clustering.py line {s['line']:5d}  {s['what']}")
    print(f"{len(plan)} mutants")
    return 0
  live = importlib.import_module(CLUSTERING).__dict__
  original = compile(tree, str(path), "exec")
  tests = clustering_tests()
  first = run_tests(tests)
  if first is not None:
    print(f"the clustering tests fail on the unmutated module ({first}): fix them first")
    return 2
  import signal

  def too_long(*_):
    raise TimeoutError("the tests ran past the mutant's time limit")

  signal.signal(signal.SIGALRM, too_long)
  results, start = [], time.time()
  for i, s in enumerate(plan, 1):
    signal.alarm(TIME_LIMIT)     # a mutant that loops for ever (a refit loop's stop) is killed
    try:
      exec(compile(mutate(tree, s), str(path), "exec"), live)
      killer = run_tests(tests)
    except Exception:  # noqa: BLE001 - a mutant that does not even load is killed
      killer = "load: " + traceback.format_exc(limit=1).splitlines()[-1]
    finally:
      signal.alarm(0)
      exec(original, live)
    results.append({**s, "module": "clustering", "killed": killer is not None, "by": killer})
    print(f"[{i}/{len(plan)}] {'killed' if killer else 'SURVIVED':8s} {s['kind']:9s} line "
          f"{s['line']:5d} {s['what']}", flush=True)
  print(f"\n{len(results)} mutants in {time.time() - start:.0f} s")
  results = earlier + results
  for kinds, label in ((SCORED, "the issue's mutants (turned, doubled, halved, swapped, switched)"),
                       (("boundary",), "boundary mutants (< vs <=, > vs >=)")):
    part = [r for r in results if r["kind"] in kinds]
    if part:
      k = sum(r["killed"] for r in part)
      print(f"{label}: {k} of {len(part)} killed = {100 * k / len(part):.1f}%")
  lines = source.splitlines()
  for r in results:
    if not r["killed"]:
      print(f"  survived {r['kind']:9s} line {r['line']:5d} {r['what']:30s} | "
            f"{lines[r['line'] - 1].strip()}")
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
