"""The causal pipeline's stage kinds (the ablate job, `heads_jax.pipelines.ablate`, runs them; the
guan job, `heads_jax.pipelines.guan`, composes them beside its own with a prefix):

    baseline: the unablated model on the evaluation set (its scores; keyed by the model's and
      data's content and the evaluation settings, `EVAL_FIELDS`)
    one stage per sub-job the config asks for (`SUB_JOBS`: groups ablated, intra/inter
      attention removed, importance, pruning, Guan et al.'s tables): its tables and arrays,
      keyed by its settings, the parts it reads and the analysis files its groups come from
    report: report.html and ablation.json from the parts' results

The stages share one `AblationRun` (the model, data and evaluator loaded when a part first
needs them, `heads_jax.ablation.tasks.load_evaluation`), and read one typed config, the
`AblationJob`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from collections.abc import Callable

import numpy as np
import pandas as pd
from flax import nnx

from heads_jax import contract, runfiles
from heads_jax.ablation.guan import paper_tables
from heads_jax.ablation import ablate, causal, evaluate, groups as groups_lib, importance as imp_lib, pruning
from heads_jax.ablation import attribution as attr_lib, corrupt as corrupt_lib, patching as patch_lib
from heads_jax.ablation import tasks
from heads_jax.errors import UserError
from heads_jax.pipelines import engine
from heads_jax.pipelines.keys import unit_key
from heads_jax.report import ablation as rep
from heads_jax.report.page import write_page


@dataclasses.dataclass
class AblationConfig:
  """What ``heads-jax ablate`` runs (its flags, one field each; see analyze/ablate.py for help)."""
  model: str
  data: str
  out: str
  task: str | None = None
  finetune_data: str | None = None
  analysis: str | None = None
  by: str | None = None              # cluster | role | layer | heads
  role_level: str = "coarse"         # coarse | fine
  mode: str = "remove"               # remove | uniform | mean
  random_groups: int = 30            # --by role: random groups of the same layers per role (causal test)
  heads: str | None = None           # 'L:H,L:H;NAME=L:H,...'
  cross: str | None = None           # intra | inter | both
  cluster: list | None = None
  paper_tables: bool = False         # Guan et al. Tables 2-3 row by row (needs --analysis)
  renormalise: bool = False
  importance: bool = False
  prune: bool = False
  prune_step: float = 0.1
  prune_max: float = 1.0
  prune_once: bool = False
  importance_per_batch: bool = False
  layer_norm: bool = True
  importance_data: str | None = None
  random_seeds: int = 3
  seed: int = 0
  max_examples: int | None = None
  max_length: int = 128
  doc_stride: int = 128             # SQuAD windows: stride over the context (run_squad.py's 128)
  batch_size: int = 64
  dtype: str | None = None
  title: str | None = None
  # which heads carry the prediction (issue 51): heads_jax.ablation.attribution / patching
  attribution: bool = False          # Hao et al.'s self-attention attribution (integrated gradients)
  patching: bool = False             # activation patching per head, and attribution patching
  steps: int = 20                    # m, the Riemann steps of the integral
  objective: str = "probability"     # F: probability | log_probability | logit of the predicted class
  corrupt: str | None = None         # mask | swap | tsv (default: swap for pairs, mask otherwise)
  corrupt_share: float = 0.5         # --corrupt mask: the share of tokens masked
  corrupted: str | None = None       # --corrupt tsv: the TSV of corrupted rows
  attribution_examples: int | None = None   # the first rows (default half); the rest held out
  maps: int = 4                      # rows whose token-to-token attribution maps are kept



def _analysis_files(ctx: engine.Context["AblationJob"], config: AblationConfig, names) -> object:
  """The content identity of the analysis files ``names`` the groups are read from (a
  host-only change of the analysis that leaves them as they were reruns nothing here)."""
  if not config.analysis or not names:
    return None
  folder = Path(config.analysis)
  return {name: ctx.files(folder / name) for name in names if (folder / name).is_file()}



@dataclasses.dataclass
class AblationRun:
  """What the sub-jobs share: the config, the model, data and evaluator (loaded when a part
  first needs them: a rerun that reuses every part loads nothing), the unablated scores, and
  the importance estimator (made by importance, read by pruning)."""
  config: AblationConfig
  log: Callable[[str], None]
  base: dict | None = None
  _loaded: tuple | None = None
  _estimator: object = None

  def _load(self):
    if self._loaded is None:
      self._loaded = tasks.load_evaluation(self.config)
    return self._loaded

  model = property(lambda self: self._load()[0])
  tokenizer = property(lambda self: self._load()[1])
  data = property(lambda self: self._load()[2])
  ev = property(lambda self: self._load()[3])

  @property
  def metrics(self) -> tuple[str, ...]:
    return self.data.metric_names

  @property
  def shown(self) -> list[str]:
    """The columns of a group table printed to the log."""
    return ["group", "num_heads", "ablation"] + [c for m in self.metrics for c in (
        m, f"{m}_change", f"random_{m}_change")]

  @property
  def estimator(self):
    """The head-importance estimator of the config (on --importance-data when given)."""
    if self._estimator is None:
      config, src = self.config, self.ev
      if config.importance_data:
        idata = evaluate.load_eval_data(config.importance_data, self.tokenizer,
                                        task=self.data.task.name, max_length=config.max_length,
                                        max_examples=config.max_examples)
        src = evaluate.Evaluator(self.model, idata, batch_size=config.batch_size, mesh=self.ev.mesh)
      self._estimator = imp_lib.ImportanceEstimator(
          src, per_example=not config.importance_per_batch, normalize_layers=config.layer_norm)
    return self._estimator


@dataclasses.dataclass
class SubResult:
  """One sub-job's result: its tables (``{file stem: table}``, written as CSV; the first is the
  one ``files`` lists), arrays (``{file stem: array}``, .npy), what goes into ablation.json under
  the sub-job's name, what its report section needs beyond its tables (``notes``), and the lines
  it logs."""
  tables: dict
  record: object
  log_lines: list
  arrays: dict = dataclasses.field(default_factory=dict)
  notes: dict = dataclasses.field(default_factory=dict)


def _records(table: pd.DataFrame) -> list:
  return json.loads(table.to_json(orient="records"))


def _by_groups(run: AblationRun) -> SubResult:
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  groups = groups_lib.load_groups(config.by, num_layers=L, num_heads=H, analysis=config.analysis,
                                  heads=config.heads, role_level=config.role_level)
  table = ablate.ablate_groups(run.ev, groups, mode=config.mode, random_seeds=config.random_seeds,
                               seed=config.seed, base=run.base, log=run.log)
  tables = {"ablation": table}
  lines = [f"\nablation by {config.by} ({config.mode}; random: {rep.RANDOM_SHORT}):",
           rep.table_text(table, run.shown)]
  if config.by == "role" and config.random_groups > 0:  # issue 26: the causal test of each role
    test = causal.causal_tests(causal.GroupEvaluator(run.ev, config.mode),
                               [g for g in groups if len(g)], random_groups=config.random_groups,
                               metric=run.metrics[0], seed=config.seed, base=run.base, log=run.log)
    tables["causal"] = test
    lines += ["\ncausal test (role vs random groups of the same layers):",
              rep.table_text(test, ["group", "num_heads", "layers", "change", "random_mean_change",
                                 "rank", "p_value"])]
  return SubResult(tables, _records(table), lines)


def _cross_groups(run: AblationRun) -> list:
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  if config.cluster or (config.analysis and not config.heads):
    cgroups = groups_lib.load_groups("cluster", num_layers=L, num_heads=H, analysis=config.analysis)
    if config.cluster:
      known = [g.name for g in cgroups]
      bad = [c for c in config.cluster if c not in known]
      if bad:
        raise UserError(f"--cluster {bad} not in {config.analysis}/clusters.csv (types: {known})")
      cgroups = [g for g in cgroups if g.name in config.cluster]
    return cgroups
  if config.heads:
    return groups_lib.load_groups("heads", num_layers=L, num_heads=H, heads=config.heads)
  raise UserError("--cross needs the heads: --analysis DIR [--cluster TYPE] or --heads L:H,...")


def _segments(run: AblationRun) -> SubResult:
  config, data = run.config, run.data
  cgroups = _cross_groups(run)
  parts = ("intra", "inter") if config.cross == "both" else (config.cross,)
  if not data.task.is_pair:
    run.log(f"note: {data.task.name} has single sentences: all attention is intra-sentence, so "
            "removing it removes the heads' whole attention" + (", and inter removal changes nothing"
                                                                if "inter" in parts else ""))
  table = ablate.ablate_segments(run.ev, cgroups, parts=parts, renormalise=config.renormalise,
                                 random_seeds=config.random_seeds, seed=config.seed, base=run.base,
                                 log=run.log)
  how = ("rows renormalised" if config.renormalise else
         "rows not renormalised: Guan et al. do not say; heads_jax default")
  return SubResult({"segment_ablation": table}, _records(table),
                   [f"\nintra/inter-sentence attention removed ({how}; random: {rep.RANDOM_SHORT}):",
                    rep.table_text(table, run.shown)])


def _importance(run: AblationRun) -> SubResult:
  config, est = run.config, run.estimator
  raw = est.raw()
  imp = imp_lib.normalize_by_layer(raw) if config.layer_norm else raw
  table = rep.importance_table(imp, raw)
  imp_settings = {"gradient": "per example" if not config.importance_per_batch else "per batch (authors' code)",
                  "layer L2 normalisation": bool(config.layer_norm),
                  "estimated on": est.evaluator.data.name}
  top = table.sort_values("rank").head(5)
  return SubResult({"importance": table}, {"settings": imp_settings, "values": imp.tolist()},
                   ["\nmost important heads: " + ", ".join(
                       f"{l}:{h} ({v:.3g})" for l, h, v in zip(top["layer"], top["head"], top["importance"]))],
                   arrays={"importance": imp}, notes={"settings": imp_settings})


def _pruning(run: AblationRun) -> SubResult:
  config = run.config
  curve = pruning.pruning_curve(run.ev, run.estimator, step=config.prune_step,
                                max_share=config.prune_max, reestimate=not config.prune_once,
                                random_seeds=config.random_seeds, seed=config.seed, log=run.log)
  summary = pruning.curve_summary(curve, run.metrics)
  prune_settings = {"step": config.prune_step, "largest share": config.prune_max,
                    "importance re-estimated after each step": not config.prune_once,
                    "random orders": config.random_seeds}
  return SubResult({"pruning": curve, "pruning_summary": summary}, _records(summary),
                   ["\npruning curve:",
                    rep.table_text(summary)],
                   notes={"settings": prune_settings})


def _paper_tables(run: AblationRun) -> SubResult:
  """Guan et al. Tables 2 and 3 row by row (``heads_jax.ablation.guan``), the paper's beside."""
  config, L, H = run.config, run.ev.num_layers, run.ev.num_heads
  cgroups = groups_lib.load_groups("cluster", num_layers=L, num_heads=H, analysis=config.analysis)
  table = paper_tables(run.ev, cgroups, base=run.base, log=run.log)
  return SubResult({"paper_tables": table}, _records(table),
                   ["\nGuan et al. Tables 2-3 (this run vs the paper):",
                    rep.table_text(table, ["table", "id", "setting", *run.metrics,
                                           "paper_exact_match", "paper_f1"])])


def _every(i: int, n: int) -> bool:
  """Whether batch ``i`` of ``n`` gets a progress line (about five a part)."""
  return i == n or i % max(1, n // 5) == 0


def _causal_rows(run: AblationRun):
  """``(first rows, held-out rows)`` of the evaluation set (`tasks.split_rows`)."""
  return tasks.split_rows(run.data, run.config.attribution_examples)


def _attribution(run: AblationRun) -> SubResult:
  """Hao et al.'s self-attention attribution of every head (`heads_jax.ablation.attribution`)
  on the first rows; the token-to-token maps of the first ``maps`` rows."""
  config = run.config
  rows, _ = _causal_rows(run)
  graphdef, state = nnx.split(run.model)
  batches = evaluate.make_batches(rows, config.batch_size, 1)
  start, wall = time.process_time(), time.perf_counter()
  res = attr_lib.attribute(attr_lib.model_apply(graphdef), state, batches, steps=config.steps,
                           objective=config.objective, maps=config.maps,
                           progress=lambda i, n: _every(i, n) and run.log(
                               f"attribution: batch {i}/{n}"))
  cpu, wall = time.process_time() - start, time.perf_counter() - wall
  table = attr_lib.head_table(res.importance, seed=config.seed)
  gap = res.value[:, None] - res.baseline
  error = float(np.mean(np.abs(res.total - gap)) / max(np.mean(np.abs(gap)), 1e-12))
  record = {"rows": len(rows), "steps": res.steps, "objective": res.objective,
            "completeness relative error": error, "cpu seconds": round(cpu, 1),
            "wall seconds": round(wall, 1)}
  top = table.sort_values("rank").head(5)
  return SubResult({"attribution": table}, record,
                   [f"\nattribution ({len(rows)} rows, m = {res.steps}; completeness error "
                    f"{100 * error:.1f}% of |F(A) - F(0)|): top heads " + ", ".join(
                        f"{l}:{h} ({v:.3g})" for l, h, v in zip(top["layer"], top["head"],
                                                               top["value"]))],
                   arrays={"attribution_maps": res.maps, "attribution_map_rows": res.map_rows},
                   notes=record)


def _corruption(run: AblationRun, rows) -> tuple[dict, str]:
  """The corrupted rows of ``rows`` and how they were made (`heads_jax.ablation.corrupt`)."""
  config = run.config
  how = config.corrupt or ("swap" if rows.task.is_pair else "mask")
  clean = {"input_ids": rows.input_ids, "attention_mask": rows.attention_mask,
           "token_type_ids": rows.token_type_ids}
  corrupted = corrupt_lib.corrupted_rows(clean, run.tokenizer, how, share=config.corrupt_share,
                                         seed=config.seed, tsv=config.corrupted,
                                         pair=rows.task.is_pair, max_length=config.max_length)
  patch_lib.check_pairs(clean, corrupted)
  text = {"mask": f"{config.corrupt_share:.0%} of the tokens replaced by the mask token",
          "swap": "the second sentence replaced by another row's of the nearest length",
          "tsv": f"the rows of {config.corrupted}"}[how]
  return corrupted, text


def _patching(run: AblationRun) -> SubResult:
  """Activation patching of every head and attribution patching beside it
  (`heads_jax.ablation.patching`) on the first rows."""
  config = run.config
  rows, _ = _causal_rows(run)
  corrupted, how = _corruption(run, rows)
  graphdef, state = nnx.split(run.model)
  batches = evaluate.make_batches(rows, config.batch_size, 1)
  start, wall = time.process_time(), time.perf_counter()
  res = patch_lib.patch(attr_lib.model_apply(graphdef), state, batches, corrupted,
                        progress=lambda i, n: _every(i, n) and run.log(f"patching: batch {i}/{n}"))
  cpu, wall = time.process_time() - start, time.perf_counter() - wall
  table = attr_lib.head_table(res.patched / res.denominator, seed=config.seed)
  est = attr_lib.head_table(res.estimated / res.denominator, seed=config.seed)
  for c in ("value", "low", "high", "rank"):
    table[f"estimated_{c}"] = est[c].to_numpy()
  corr = res.correlation()
  record = {"rows": len(rows), "corruption": how,
            "clean logit difference": float(res.clean.mean()),
            "corrupted logit difference": float(res.corrupted.mean()),
            "correlation with attribution patching": corr, "cpu seconds": round(cpu, 1),
            "wall seconds": round(wall, 1)}
  top = table.sort_values("rank").head(5)
  return SubResult({"patching": table}, record,
                   [f"\npatching ({len(rows)} rows; {how}): logit difference "
                    f"{res.clean.mean():.3f} clean, {res.corrupted.mean():.3f} corrupted; top "
                    "heads " + ", ".join(f"{l}:{h} ({v:.2f})" for l, h, v in zip(
                        top["layer"], top["head"], top["value"]))
                    + f"; attribution patching r = {corr['pearson']:.2f} (Spearman "
                    f"{corr['spearman']:.2f})"], notes=record)


def _head_scores(out: Path, stem: str) -> np.ndarray:
  """``[l, h]`` of a per-head table the attribution or patching part wrote."""
  return _grid(pd.read_csv(out / f"{stem}.csv"), "value")


def _carriers(run: AblationRun) -> SubResult:
  """Which roles carry the prediction: each role's summed attribution and patching effect
  against random heads of the same layers (`causal.causal_tests` with `causal.HeadScores`)."""
  config, out = run.config, Path(run.config.out)
  L, H = run.ev.num_layers, run.ev.num_heads
  roles = [g for g in groups_lib.load_groups("role", num_layers=L, num_heads=H,
                                             analysis=config.analysis,
                                             role_level=config.role_level) if len(g)]
  tables = []
  for stem in ("attribution", "patching"):
    if (out / f"{stem}.csv").is_file() and getattr(config, stem):
      tables.append(causal.causal_tests(causal.HeadScores(stem, _head_scores(out, stem)), roles,
                                        random_groups=max(config.random_groups, 1),
                                        metric=stem, seed=config.seed, log=run.log))
  table = pd.concat(tables, ignore_index=True)
  return SubResult({"carriers": table}, _records(table),
                   ["\nwhich roles carry the prediction (summed over the role's heads vs random "
                    "heads of the same layers):",
                    rep.table_text(table, ["group", "ablation", "num_heads", "change",
                                           "random_mean_change", "p_value"])])


def _roles(config: AblationConfig, L: int, H: int) -> list:
  """The role groups of ``--analysis`` (``unskilled``, the heads without a role, left out)."""
  return [g for g in groups_lib.load_groups("role", num_layers=L, num_heads=H,
                                            analysis=config.analysis, role_level=config.role_level)
          if g.name != "unskilled"]


def _role_heads(config: AblationConfig, L: int, H: int) -> list:
  return sorted({h for g in _roles(config, L, H) for h in g.heads})


def _head_pruning(run: AblationRun) -> SubResult:
  """Pruning curves on the held-out rows by attribution, by Michel et al.'s importance (on the
  first rows, the attribution's), by role (the role heads first) and in random orders."""
  config, out = run.config, Path(run.config.out)
  first, held = _causal_rows(run)
  if held is None:
    raise UserError(f"--attribution-examples {len(first)} leaves no held-out rows for the "
                    "pruning curves: give fewer")
  L, H = run.ev.num_layers, run.ev.num_heads
  everyone = np.zeros((L, H), bool)
  est = imp_lib.ImportanceEstimator(evaluate.Evaluator(run.model, first,
                                                       batch_size=config.batch_size,
                                                       mesh=run.ev.mesh),
                                    per_example=True, normalize_layers=config.layer_norm)
  orders = {("attribution", -1): pruning.importance_order(_head_scores(out, "attribution"), everyone),
            ("importance", -1): pruning.importance_order(est(), everyone)}
  rng = np.random.default_rng(config.seed)
  if config.analysis:
    role = _role_heads(config, L, H)
    rest = [(l, h) for l in range(L) for h in range(H) if (l, h) not in set(role)]
    orders[("role", -1)] = ([role[i] for i in rng.permutation(len(role))]
                            + [rest[i] for i in rng.permutation(len(rest))])
  for s in range(config.random_seeds):
    perm = np.random.default_rng(config.seed + s).permutation(L * H)
    orders[("random", config.seed + s)] = [(int(j // H), int(j % H)) for j in perm]
  held_ev = evaluate.Evaluator(run.model, held, batch_size=config.batch_size, mesh=run.ev.mesh)
  curve = pruning.order_curves(held_ev, orders, step=config.prune_step,
                               max_share=config.prune_max, log=run.log)
  summary = (curve.groupby(["method", "share_pruned"])["accuracy"].mean().unstack(0) * 100).round(1)
  return SubResult({"head_pruning": curve}, {"held-out rows": len(held),
                                             "methods": sorted({m for m, _ in orders})},
                   [f"\npruning curves on {len(held)} held-out rows (accuracy %):",
                    summary.to_string()])


@dataclasses.dataclass(frozen=True)
class SubJob:
  """One part of the ablate job (a stage of the engine): its name (the stage, the key in
  ablation.json and its ``files``), when the config asks for it, what computes it, the config
  fields its result depends on (its key, with the inputs), the file stems it writes, and the
  parts it reads beside the baseline."""
  name: str
  text: str
  wanted: Callable[[AblationConfig], bool]
  run: Callable[[AblationRun], SubResult]
  fields: tuple[str, ...]
  stems: tuple[str, ...]
  reads: tuple[str, ...] = ()
  analysis_files: tuple[str, ...] = ()   # the files of --analysis it reads (its key: their content)


# In order; pruning reads the importance sub-job's estimator.
SUB_JOBS = (
    SubJob("ablation", "groups of heads ablated", lambda c: bool(c.by), _by_groups,
           ("by", "role_level", "mode", "random_groups", "heads", "random_seeds", "seed"),
           ("ablation", "causal"), analysis_files=(contract.CLUSTERS_CSV, contract.TESTS_CSV)),
    SubJob("segment_ablation", "intra-/inter-sentence attention removed", lambda c: bool(c.cross), _segments,
           ("cross", "cluster", "heads", "renormalise", "random_seeds", "seed"),
           ("segment_ablation",), analysis_files=(contract.CLUSTERS_CSV,)),
    SubJob("importance", "head importance (Michel et al.)", lambda c: bool(c.importance or c.prune), _importance,
           ("importance_per_batch", "layer_norm"), ("importance",)),
    SubJob("pruning", "the pruning curve", lambda c: bool(c.prune and not c.attribution), _pruning,
           ("prune_step", "prune_max", "prune_once", "random_seeds", "seed"),
           ("pruning", "pruning_summary"), reads=("importance",)),
    SubJob("paper_tables", "Guan et al. Tables 2-3", lambda c: bool(c.paper_tables), _paper_tables, (), ("paper_tables",),
           analysis_files=(contract.CLUSTERS_CSV,)),
    SubJob("attribution", "self-attention attribution (Hao et al.)", lambda c: bool(c.attribution),
           _attribution, ("steps", "objective", "attribution_examples", "maps", "seed"),
           ("attribution", "attribution_maps", "attribution_map_rows")),
    SubJob("patching", "activation and attribution patching per head", lambda c: bool(c.patching),
           _patching, ("corrupt", "corrupt_share", "corrupted", "attribution_examples", "seed"),
           ("patching",)),
    SubJob("carriers", "which roles carry the prediction",
           lambda c: bool((c.attribution or c.patching) and c.analysis), _carriers,
           ("role_level", "random_groups", "seed"), ("carriers",),
           reads=("attribution", "patching"), analysis_files=(contract.TESTS_CSV,)),
    SubJob("head_pruning", "pruning curves by attribution, importance, role and at random",
           lambda c: bool(c.attribution and c.prune), _head_pruning,
           ("prune_step", "prune_max", "random_seeds", "seed", "role_level", "layer_norm",
            "attribution_examples"), ("head_pruning",), reads=("attribution",),
           analysis_files=(contract.TESTS_CSV,)),
)
# The settings of the unablated model's evaluation (every part reads it).
EVAL_FIELDS = ("task", "max_examples", "max_length", "doc_stride", "batch_size", "dtype")
REPORT = "report"


@dataclasses.dataclass(frozen=True)
class AblationJob:
  """The ablate job's one typed config (the engine's ``config``; in a pipeline that composes
  the ablation's stages beside its own, the field of its config the stages read, `Stage.part`):
  the settings, the sub-jobs they ask for (`SUB_JOBS`), the stages' name ``prefix`` ("" in the
  ablate job; e.g. guan's ``ablation_``), the folder ``under`` of the run directory that
  ``config.out`` is ("": the run directory itself; ``redo`` removes the stages' outputs
  there), and ``run``, what the stages share (the model and evaluator loaded once, the
  importance estimator)."""
  config: AblationConfig
  jobs: tuple
  run: AblationRun
  prefix: str = ""
  under: str = ""

  def stage(self, name: str) -> str:
    """The stage name of ``name`` (``baseline``, a sub-job, ``report``) in this pipeline."""
    return self.prefix + name

  def reads(self, sub: "SubJob") -> tuple[str, ...]:
    """The parts ``sub`` reads that this job runs (carriers reads attribution and/or patching)."""
    ran = {j.name for j in self.jobs}
    return tuple(r for r in sub.reads if r in ran)

  def at(self, name: str) -> str:
    """The path of the output ``name`` relative to the run directory."""
    return f"{self.under}/{name}" if self.under else name


def ablation_job(config: AblationConfig, log=print, *, prefix: str = "",
                 under: str = "") -> AblationJob:
  """The `AblationJob` of ``config``: the sub-jobs it asks for, its shared run (logging under
  its stage's line)."""
  return AblationJob(config=config, jobs=tuple(j for j in SUB_JOBS if j.wanted(config)),
                     run=AblationRun(config, lambda line: log("  " + str(line))),
                     prefix=prefix, under=under)


def _baseline(ctx: engine.Context[AblationJob]) -> engine.UnitResult:
  """The unablated model on the evaluation set; keyed by the model's and data's content and
  the evaluation settings."""
  job = ctx.config
  config, run = job.config, job.run
  key = unit_key({f: getattr(config, f) for f in EVAL_FIELDS}, inputs={
      "model": ctx.model(config.model), "data": ctx.data(config.data),
      "finetune_data": (ctx.files(tasks.finetune_data_file(config.finetune_data))
                        if config.finetune_data else None)})

  def fn():
    ev, data = run.ev, run.data
    base = {k: (int(v) if k == "n" else float(v)) for k, v in ev.evaluate().items()}
    return {"metrics": base, "metric_names": list(data.metric_names), "task": data.task.name,
            "evaluation set": data.name, "examples": len(data), "layers": ev.num_layers,
            "heads": ev.num_heads}

  res = engine.run_unit(ctx, job.stage("baseline"), "baseline", key, fn)
  o = res.outputs
  ctx.sub(f"{o['task']}: {o['examples']} examples ({o['evaluation set']}); {o['layers']} layers "
          f"x {o['heads']} heads; unablated " + ", ".join(
              f"{m} {rep.value_text(m, o['metrics'][m])}" for m in o["metric_names"]))
  return res


def _part(ctx: engine.Context[AblationJob], sub: SubJob) -> engine.UnitResult:
  """The sub-job ``sub``: its tables and arrays into ``config.out``; keyed by its settings, the
  baseline's and the parts' it reads finish times and the content of the analysis files it
  reads."""
  job = ctx.config
  config, run, out = job.config, job.run, Path(job.config.out)
  baseline = ctx.results[job.stage("baseline")]
  key = unit_key({f: getattr(config, f) for f in sub.fields}, inputs={
      "baseline": baseline.finished,
      "reads": [ctx.results[job.stage(r)].finished for r in job.reads(sub)],
      "analysis": _analysis_files(ctx, config, sub.analysis_files),
      "importance_data": (ctx.data(config.importance_data)
                          if sub.name == "importance" and config.importance_data else None)})

  def fn():
    run.base = baseline.outputs["metrics"]   # the unablated scores, from the baseline's result
    r = sub.run(run)
    files = [str(runfiles.write_table(out, stem, table)) for stem, table in r.tables.items()]
    for stem, array in r.arrays.items():
      runfiles.write_array(out, stem, array)
    written = {**{f"{stem}.csv": _held(t) for stem, t in r.tables.items()},
               **{f"{stem}.npy": _held(a) for stem, a in r.arrays.items()}}
    return {"files": files, "written": written, "record": r.record, "lines": r.log_lines,
            "notes": r.notes}

  res = engine.run_unit(  # reused while every file it wrote reads as written
      ctx, job.stage(sub.name), sub.name, key, fn,
      clean=[out / f"{s}.{e}" for s in sub.stems for e in ("csv", "npy")],
      intact=lambda done: _damaged(out, (done or {}).get("written")
                                   or {f"{sub.stems[0]}.csv": None}),
      paths=("files.*",))   # recorded relative to the run folder: a moved run reads its own
  for line in res.outputs["lines"]:
    ctx.sub(line)
  return res


def _report(ctx: engine.Context[AblationJob]) -> engine.UnitResult:
  """report.html and ablation.json from the baseline's and the parts' results."""
  job = ctx.config
  config, out = job.config, Path(job.config.out)
  base = ctx.results[job.stage("baseline")]
  parts = {j.name: ctx.results[job.stage(j.name)] for j in job.jobs}
  key = unit_key({}, inputs={"baseline": base.finished,
                             "parts": {n: p.finished for n, p in parts.items()},
                             "title": config.title})   # the title: cosmetic for a result, not here
  res = engine.run_unit(ctx, job.stage(REPORT), REPORT, key,
                        lambda: _write_report(config, base.outputs, parts),
                        clean=[out / contract.REPORT_HTML, out / runfiles.ABLATION_JSON],
                        intact=lambda _: _damaged(out, {contract.REPORT_HTML: None,
                                                        runfiles.ABLATION_JSON: None}),
                        paths=("files.*", "report"))
  ctx.sub(f"report: {res.outputs['report']}")
  return res


def ablation_stages(job: AblationJob, part: str = "") -> list[engine.Stage[AblationJob]]:
  """The engine's stages of ``job``: ``baseline``, one per sub-job, ``report`` (each name with
  ``job.prefix``), module-level functions of ``ctx.config`` (the `AblationJob`: the job's
  config, or its field ``part`` in a pipeline that composes these stages beside its own)."""
  base = job.stage("baseline")
  return [engine.Stage(base, "the unablated model on the evaluation set", _baseline, part=part),
          *(engine.Stage(job.stage(j.name), j.text, functools.partial(_part, sub=j),
                         reads=(base, *(job.stage(r) for r in job.reads(j))),
                         outputs=tuple(job.at(f"{s}.{e}") for s in j.stems for e in ("csv", "npy")),
                         part=part)
            for j in job.jobs),
          engine.Stage(job.stage(REPORT), "the report and ablation.json", _report,
                       reads=(base, *(job.stage(j.name) for j in job.jobs)),
                       outputs=tuple(job.at(n) for n in (contract.REPORT_HTML,
                                                         runfiles.ABLATION_JSON, "figures")),
                       part=part)]


def _write_report(config: AblationConfig, base: dict, parts: dict) -> dict:
  """Writes report.html (sections and figures from the parts' tables, `heads_jax.report.ablation`)
  and ablation.json; returns ablation.json's content."""
  out = Path(config.out)
  metrics = base["metric_names"]
  settings = {"model": str(config.model), "data": config.data, "task": base["task"],
              "evaluation set": base["evaluation set"], "examples": base["examples"],
              "layers": base["layers"], "heads": base["heads"], "metrics": ", ".join(metrics),
              "random baseline": rep.RANDOM_BASELINE, "random seeds": config.random_seeds,
              "seed": config.seed, "max length": config.max_length}
  if "ablation" in parts:
    settings.update({"grouping": config.by, "ablation mode": config.mode})
  if "segment_ablation" in parts:
    settings["intra/inter rows renormalised"] = bool(config.renormalise)
  settings["seconds"] = round(sum(p.seconds or 0 for p in parts.values()), 1)

  def table(stem):
    """A part's table as it wrote it (text columns: empty cells stay "", not NaN)."""
    path = out / f"{stem}.csv"
    if not path.is_file():
      return None
    t = pd.read_csv(path)
    text = [c for c in t.columns if not pd.api.types.is_numeric_dtype(t[c])]
    t[text] = t[text].fillna("")
    return t

  results = rep.AblationResults(
      base=base["metrics"], metrics=tuple(metrics),
      groups=table("ablation") if "ablation" in parts else None,
      grouping=config.by or "group", group_note=_group_note(config),
      causal=table("causal") if "ablation" in parts else None,
      segments=table("segment_ablation") if "segment_ablation" in parts else None,
      importance=_grid(table("importance"), "importance") if "importance" in parts else None,
      importance_raw=_grid(table("importance"), "importance_raw") if "importance" in parts else None,
      importance_settings=parts["importance"].outputs["notes"]["settings"]
      if "importance" in parts else None,
      importance_label="importance (layer-normalised)" if config.layer_norm else "E|dL/dgate|",
      pruning=table("pruning") if "pruning" in parts else None,
      pruning_summary=table("pruning_summary") if "pruning" in parts else None,
      pruning_settings=parts["pruning"].outputs["notes"]["settings"] if "pruning" in parts else None,
      paper_tables=table("paper_tables") if "paper_tables" in parts else None,
      model=str(config.model),
      attribution=table("attribution") if "attribution" in parts else None,
      attribution_settings=parts["attribution"].outputs["notes"] if "attribution" in parts else None,
      patching=table("patching") if "patching" in parts else None,
      patching_settings=parts["patching"].outputs["notes"] if "patching" in parts else None,
      roles=(_role_grid(config, base["layers"], base["heads"])
             if config.analysis and ("attribution" in parts or "patching" in parts) else None),
      carriers=table("carriers") if "carriers" in parts else None,
      head_pruning=table("head_pruning") if "head_pruning" in parts else None)
  sections = rep.report_sections(results, out / "figures")
  title = config.title or f"Head ablation: {Path(str(config.model)).name} on {base['task']}"
  report = write_page(out, title=title, sections=sections, settings=settings,
                      subtitle=f"model: {config.model} | data: {base['evaluation set']}")
  doc = {"settings": settings, "baseline": base["metrics"],
         "files": {n: p.outputs["files"][0] for n, p in parts.items()},
         **{n: p.outputs["record"] for n, p in parts.items()}, "report": str(report)}
  runfiles.write_ablation_json(out, doc)
  return doc


def _role_grid(config: AblationConfig, L: int, H: int) -> np.ndarray:
  """``[l, h]`` object array: each head's roles of ``--analysis`` joined by "," ("" none)."""
  grid = np.full((L, H), "", dtype=object)
  for g in _roles(config, L, H):
    for l, h in g.heads:
      grid[l, h] = f"{grid[l, h]},{g.name}" if grid[l, h] else g.name
  return grid


def _held(value) -> list:
  """What a written table or array holds, to check it against when it is reused: a table's rows
  and columns, an array's shape."""
  if isinstance(value, pd.DataFrame):
    return [len(value), [str(c) for c in value.columns]]
  return [list(np.shape(value))]


def _damaged(out, written: dict) -> str | None:
  """None when every file of ``written`` (``{name in out: _held of what was written, or None}``)
  is there and reads as written, else which is not and why (`engine.run_unit`'s ``intact``: a
  part whose file was deleted, truncated or replaced runs again instead of being reused over
  it). Tables are read with pandas, arrays with numpy, JSON with json; an HTML page must not be
  empty."""
  for name, held in written.items():
    path = Path(out) / name
    if not path.is_file():
      return f"{path} is missing"
    try:
      if name.endswith(".csv"):
        now = _held(pd.read_csv(path))
      elif name.endswith(".npy"):
        now = _held(np.load(path, allow_pickle=False))
      elif name.endswith(".json"):
        now, _ = None, json.loads(path.read_text())
      else:
        now = None if path.stat().st_size else "empty"
    except (ValueError, OSError) as e:   # pandas' parser errors and bad UTF-8 are ValueErrors
      return f"{path} cannot be read ({type(e).__name__})"
    if now == "empty":
      return f"{path} is empty"
    if held is not None and now != held:
      return f"{path} does not hold what was written (damaged or edited)"
  return None


def _grid(table: pd.DataFrame, column: str) -> np.ndarray:
  """``[l, h]`` of a long (layer, head, value) table's ``column``."""
  return table.pivot(index="layer", columns="head", values=column).to_numpy(float)


def _group_note(config: AblationConfig) -> str:
  how = {"remove": "removed (gate 0)", "uniform": "given uniform attention over the real tokens",
         "mean": "replaced by their mean output over the data"}[config.mode]
  return (f"Heads {how}; groups by {config.by}"
          + (f" from {config.analysis}" if config.analysis else "") + ".")
