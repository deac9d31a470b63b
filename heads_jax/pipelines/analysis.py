"""The analysis as two stages, as every job runs it (`heads_jax.pipelines.stages.scores` and
`heads_jax.pipelines.stages.statistics` key and compose them; DESIGN.md section 4):

    device pass (`device_work`): data specs -> encoded batches -> jitted step (forward + sieves +
      statistics, on device) -> scores.npz, measures.npz, run.json (`DEVICE_FILES`); its result
      depends on the model, the data and `DEVICE_KEYS` only
    host statistics (`host_work`): scores.npz -> hypothesis tests, roles, summary, clusters (host)
      -> the head view's examples, figures and report.html (`HOST_FILES`); its result depends on
      the device pass's and the other settings (`host_settings`)

so a change of a host setting (``--tau``, ``--alpha``, ``--test``, ``--correction``, the rule,
the clusters) reruns the host statistics only. Several data specs may be given (e.g. UD
sentences for the syntactic roles and MRPC pairs for ``block``): their sequences are analysed in
turn and stacked along N; a role whose sieve is empty for a sequence (no arcs, no pair) is NaN
there and that sequence does not enter the role's test. ``scores.npz`` then also holds
``data_index`` int ``[N]`` (which spec each sequence came from) beside the contract keys. The
device pass itself (batching, compilation) is `heads_jax.pipelines.device_pass`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import numpy as np

from heads_jax import contract, runfiles
from heads_jax.data.vocabulary import PLAIN_TWINS, ROLES
from heads_jax.data.specs import check_max_examples, parse_spec
from heads_jax.errors import UserError
from heads_jax.hoststats.calibration import DEFAULT_RULE, NEAR_UNIFORM_NATS, RULES, apply_rule
from heads_jax.hoststats.clustering import cluster_heads
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import assignment_array, coarse_roles_by_layer, format_roles_by_layer
from heads_jax.hoststats.summary import computed_roles, summary_figures
from heads_jax.hoststats.terms import term_share_summary
from heads_jax.model.loading import layer_windows, load_model
from heads_jax.pipelines.device_pass import compute_scores, write_scores
from heads_jax.pipelines.robustness import ensure_robustness_pass, robustness_host
from heads_jax.report.analysis import build_analysis_report
from heads_jax.report.headline import headline_text
from heads_jax.stats.examples import DEFAULT_PER_HEAD, write_head_examples
from heads_jax.stats.step import STATS_IMPLS
from heads_jax.storage import local_copy

# Settings that determine scores.npz (the device pass); the others only affect host statistics.
DEVICE_KEYS = ("model", "data", "max_examples", "max_length", "direction", "syntax", "parser", "roles",
               "measures", "js")


@dataclasses.dataclass
class AnalysisConfig:
  """Everything an analysis run depends on (written to ``run.json`` and ``tests.json``)."""
  model: str
  data: tuple[str, ...]
  out: str
  max_examples: int | None = None
  max_length: int = 128
  batch_size: int = 32
  tau: float | str = 3.0
  alpha: float = 0.05
  test: str = "t"
  correction: str = "none"
  rule: str = DEFAULT_RULE           # "calibrated", "paper" or "average" (hoststats.roles, DESIGN.md 3)
  near_uniform_nats: float = NEAR_UNIFORM_NATS
  direction: str = "dep2head"
  syntax: bool = True
  parser: str | None = None  # spaCy pipeline for text inputs (default en_core_web_sm); "none": no arcs for text
  roles: tuple[str, ...] = ROLES
  measures: bool = True              # Clark/Kovaleva measures -> measures.npz (entropy, attention to tokens)
  js: bool = False                   # Jensen-Shannon distance between every pair of heads (about 2x the time)
  clusters: int = 4
  cluster_method: str = "kmeans"
  seed: int = 0
  sort_window: int | None = 1024     # sort by length within windows of this many examples (less padding)
  bucket_step: int = 16              # padded lengths are multiples of this (smaller: less padding, more shapes)
  report: bool = True
  title: str | None = None
  examples: int = DEFAULT_PER_HEAD   # sequences per head in the report's head view (examples.json); 0: none
  robustness: bool = False           # second pass: norm-weighted roles, sinks, heads as parsers
                                     # (pipelines/robustness.py); `heads-jax analyze` turns it on
  pack: bool = True                  # several sequences per row in the device pass (same scores;
                                     # False: one sequence per row, padded to 32/64/128)
  stats_impl: str = "auto"           # the statistics path (stats.step.STATS_IMPLS; "auto": the
                                     # fastest measured where the maps fit, map-free past that)

  @classmethod
  def from_config(cls, block, **fields) -> "AnalysisConfig":
    """The analysis settings of a pipeline's config ``block`` (a ConfigDict or dict whose keys
    are named as this class's fields; other keys are the pipeline's own), with ``fields``
    (model, data, out, ...) over them."""
    names = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in dict(block or {}).items() if k in names}
    d.update(fields)
    for k in ("data", "roles"):
      if k in d:
        d[k] = tuple(d[k])
    return cls(**d)

  def device_settings(self) -> dict:
    d = dataclasses.asdict(self)
    d["data"] = list(self.data)
    d["roles"] = list(self.roles)
    return {k: d[k] for k in DEVICE_KEYS}


def check_rule_settings(cfg: AnalysisConfig) -> None:
  """The role rule's settings (UserError): a known rule; the calibrated rule for an
  entropy-weighted role needs its plain twin (`PLAIN_TWINS`: its test C); a threshold >= 0."""
  if cfg.rule not in RULES:
    raise UserError(f"--rule must be one of {', '.join(RULES)}; got {cfg.rule!r}")
  for weighted, plain in PLAIN_TWINS.items():
    if cfg.rule == "calibrated" and weighted in cfg.roles and plain not in cfg.roles:
      raise UserError(f"the calibrated rule for {weighted} needs {plain}: add it to --roles, or "
                      "use --rule paper")
  if not cfg.near_uniform_nats >= 0:
    raise UserError(f"--near-uniform-nats must be >= 0; got {cfg.near_uniform_nats}")


def check_settings(cfg: AnalysisConfig) -> None:
  """Every value of ``cfg`` that can be checked without the model or the data (UserError, one
  line, before any file is written or any device work): the rule, tau, alpha, the counts, and
  the data specs (their forms and files; the same data twice is refused: it would double every
  n and make every p-value too small)."""
  check_rule_settings(cfg)
  tau = cfg.tau
  if not (tau == "auto" or (isinstance(tau, (int, float)) and not isinstance(tau, bool)
                            and math.isfinite(tau) and tau >= 0)):
    raise UserError(f"--tau must be a number >= 0 (the sieve-bias threshold of the tests) or "
                    f"'auto'; got {tau!r}")
  if not (isinstance(cfg.alpha, (int, float)) and 0 < cfg.alpha < 1):
    raise UserError(f"--alpha must be a significance level between 0 and 1 (e.g. 0.05); got "
                    f"{cfg.alpha!r}")
  for flag, value, low in (("--examples", cfg.examples, 0), ("--clusters", cfg.clusters, 1),
                           ("--batch-size", cfg.batch_size, 1),
                           ("--bucket-step", cfg.bucket_step, 1)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise UserError(f"{flag} must be an integer >= {low}; got {value!r}")
  if cfg.stats_impl not in STATS_IMPLS:
    raise UserError(f"--stats-impl must be one of {', '.join(STATS_IMPLS)}; got {cfg.stats_impl!r}")
  if not isinstance(cfg.max_length, int) or cfg.max_length < 4:
    raise UserError(f"--max-length must be an integer >= 4 ([CLS] A [SEP] B [SEP] needs room); "
                    f"got {cfg.max_length!r}")
  try:
    check_max_examples(cfg.max_examples)
    specs = [parse_spec(d) for d in cfg.data]
  except ValueError as e:
    raise UserError(str(e)) from None
  seen = {}
  for s in specs:
    key = (s.kind, str(s.path), s.task, s.split, s.header, s.version, s.sample, s.seed)
    if key in seen:
      raise UserError(f"--data {s.spec!r} names the same data as --data {seen[key]!r}: every "
                      "sequence would be counted twice (n doubled, p-values too small); give "
                      "each data set once")
    seen[key] = s.spec



# The files each stage writes (a rerun of the stage removes them first). The head view's
# examples.json is the host stage's but keeps its own key (stats/examples.py: a forward pass,
# reused while the sequences are the same), so it is not removed; nor is report.html, which
# `host_work` rebuilds, or removes with a line when the run asks for no report.
DEVICE_FILES = (contract.SCORES_FILE, contract.MEASURES_FILE, contract.RUN_FILE,
                contract.ROBUSTNESS_FILE)
HOST_FILES = (contract.TESTS_CSV, contract.TESTS_JSON, contract.SETTINGS_JSON,
              contract.CLUSTERS_CSV, contract.CLUSTERS_JSON, contract.SUMMARY_JSON,
              contract.PARSER_CSV)
# Settings of the device pass that do not change scores.npz (how it batches): in neither key.
BATCHING = ("batch_size", "sort_window", "pack", "stats_impl")


def host_settings(cfg: AnalysisConfig) -> dict:
  """The settings the host statistics depend on: every field but the device pass's
  (`DEVICE_KEYS`, `BATCHING`) and ``out``."""
  d = dataclasses.asdict(cfg)
  d["roles"] = list(cfg.roles)
  return {k: v for k, v in d.items() if k not in DEVICE_KEYS + BATCHING + ("out",)}


def content_identity(cfg: AnalysisConfig, cache=None) -> dict:
  """The content of the model and data behind ``cfg``'s paths (`runfiles.model_identity`,
  `runfiles.data_identity`), as run.json records it (``ablate --analysis`` checks its model)."""
  return {"model": runfiles.model_identity(cfg.model, cache=cache),
          "data": [runfiles.data_identity(d, cache=cache) for d in cfg.data]}


def device_work(cfg: AnalysisConfig, *, model=None, tokenizer=None, identity=None,
                progress: bool = True, log=print) -> list:
  """The device pass of the analysis in ``cfg.out``: writes scores.npz, measures.npz and
  run.json (its settings, each data set's counts, ``identity``: the content of the model and
  data, `content_identity` when None); returns each data set's counts (``data_info``)."""
  out = Path(cfg.out)
  scores = compute_scores(cfg, model, tokenizer, progress=progress, log=log)
  write_scores(out, scores)
  if "measures" in scores:
    contract.write_measures(out, scores["measures"])
  # the statistics path asked for and the ones taken (the paths agree to float32 rounding:
  # not in the reuse key)
  settings = {**cfg.device_settings(), "stats_impl": cfg.stats_impl,
              "stats_paths": scores.get("stats_paths", []),
              # where the model is, as runs record it: absolute, or relative to --out inside it
              "model": runfiles.to_run_path(cfg.model, out)}
  contract.write_run(out, settings, scores["data_info"],
                     inputs=identity if identity is not None else content_identity(cfg))
  return scores["data_info"]


def second_pass(cfg: AnalysisConfig, *, load=None, log=print) -> bool:
  """The device pass's second part (``cfg.robustness``, one process): norm-weighted roles,
  sinks, heads as parsers, once per scores.npz (`ensure_robustness_pass`: it keeps its result
  while scores.npz is the same). ``load() -> (model, tokenizer)``, called only when it runs
  (default: load ``cfg.model``). Returns whether it ran."""
  if not (cfg.robustness and jax.process_count() == 1):
    return False
  return ensure_robustness_pass(cfg, Path(cfg.out), log=log,
                                load=load or (lambda: load_model(local_copy(cfg.model))))


def scores_intact(cfg: AnalysisConfig) -> str | None:
  """None when the device pass's files in ``cfg.out`` are there and readable, else what is
  wrong (one line naming the file)."""
  try:
    contract.read_run(cfg.out)
    contract.read_scores(cfg.out)
  except (UserError, ValueError, OSError) as e:
    return str(e)
  if contract.read_run(cfg.out) is None:
    return f"{Path(cfg.out) / contract.RUN_FILE} is missing"
  why = scores_complete(contract.read_scores(cfg.out), Path(cfg.out) / contract.SCORES_FILE)
  return why


def scores_complete(scores, where) -> str | None:
  """None when ``scores`` holds what the host statistics' definitions need (each sequence's
  length and special-token share: the clustering's reference at the data's lengths; a windowed
  model's per-sequence baselines come with them), else one line saying what is missing (the
  device pass then runs again: no head is named under another definition)."""
  if scores.lengths is None or scores.special_share is None:
    missing = "lengths" if scores.lengths is None else "special-token shares"
    return (f"{where} holds no {missing} (written before they were recorded): the clustering's "
            "reference needs each sequence's length and special-token share")
  return None


def statistics_intact(cfg: AnalysisConfig) -> str | None:
  """None when the host statistics' files in ``cfg.out`` are there (report.html with
  ``cfg.report``), else the first missing file."""
  names = [contract.TESTS_CSV, contract.SUMMARY_JSON, contract.CLUSTERS_CSV]
  if cfg.report:
    names.append(contract.REPORT_HTML)
  for name in names:
    if not (Path(cfg.out) / name).is_file():
      return f"{Path(cfg.out) / name} is missing"
  return None


def host_statistics(cfg: AnalysisConfig, scores, data_info: list) -> dict:
  """Tests, roles, summary and clusters from ``scores`` (host only); writes their files."""
  out = Path(cfg.out)
  passthrough = {"direction": cfg.direction, "model": str(cfg.model),
                 "data": " + ".join(cfg.data), "max_length": cfg.max_length,
                 "max_examples": cfg.max_examples,
                 "arcs": "; ".join(f"{name}: {d.get('arcs') or 'none (no parse)'}"
                                   for name, d in zip(cfg.data, data_info)),
                 "syntax": cfg.syntax}
  for key, name in (("num_truncated", "sequences_truncated"),
                    ("num_empty_dropped", "sequences_empty_dropped"),
                    ("num_duplicates", "sequences_duplicated")):
    if any(d.get(key) for d in data_info):  # the report's settings say so
      passthrough[name] = sum(int(d.get(key) or 0) for d in data_info)
  warnings = [w for d in data_info for w in d.get("warnings", [])]
  if scores.num_sequences < 2:
    warnings.append(few_sequences_warning(scores.num_sequences))
  if warnings:
    passthrough["warnings"] = " | ".join(warnings)
  tests, settings = hypothesis_tests(scores.sieve_bias, scores.roles, tau=cfg.tau, alpha=cfg.alpha,
                                     test=cfg.test, correction=cfg.correction, settings=passthrough)
  incomplete = scores_complete(scores, out / contract.SCORES_FILE)
  if incomplete:
    raise UserError(f"{incomplete}; re-run the analysis with --overwrite")
  windows = scores.layer_windows or layer_windows(local_copy(cfg.model))
  entropy = term_shares = None
  if (out / contract.MEASURES_FILE).is_file():  # the row entropy: near-uniform heads
    m = contract.read_measures(out)
    if np.array_equal(m["lengths"], scores.lengths):  # not a stale file of another run
      entropy = m["entropy"]
      if "term_shares" in m:  # DeBERTa: each head's c2c / c2p / p2c share
        term_shares = term_share_summary(m["term_shares"], m["term_names"])
  tests, settings = apply_rule(tests, settings, scores.sieve_bias, scores.roles, scores.lengths,
                               rule=cfg.rule, entropy=entropy,
                               near_uniform_nats=cfg.near_uniform_nats,
                               windows=windows, uniform=scores.uniform)
  contract.write_tests(tests, settings, out)
  summary = summary_figures(scores.sieve_bias, scores.roles, tests, rule=cfg.rule,
                            near_uniform_computed=entropy is not None, tau=settings["tau"])
  if term_shares is not None:
    summary["term_shares"] = term_shares
  contract.write_summary(summary, out)
  clusters, info = cluster_heads(scores.distance, k=cfg.clusters, method=cfg.cluster_method,
                                 seed=cfg.seed, lengths=scores.lengths,
                                 special_share=scores.special_share, windows=windows)
  contract.write_clusters(clusters, info, out)
  return {"tests": tests, "settings": settings, "summary": summary, "clusters": clusters,
          "cluster_info": info}


def few_sequences_warning(n: int) -> str:
  return (f"only {n} sequence(s): no test can run (a test needs n >= 2 sequences), so every "
          "head is reported with no role; analyse more data")


def host_work(cfg: AnalysisConfig, data_info: list, *, model=None, tokenizer=None,
              log=print) -> dict:
  """The host statistics of the analysis in ``cfg.out``: tests, roles, summary and clusters from
  scores.npz (`host_statistics`), the second pass's statistics, the head view's examples and the
  report; logs the headline. ``data_info``: the device pass's (`device_work`). Returns the
  results in memory plus ``out`` and ``report``."""
  out = Path(cfg.out)
  robust = cfg.robustness and jax.process_count() == 1
  scores = contract.read_scores(out)
  if scores.num_sequences < 2:
    log(f"warning: {few_sequences_warning(scores.num_sequences)}")
  host = host_statistics(cfg, scores, data_info)
  if robust:
    host["robustness"] = robustness_host(out, host, log=log)
  assigned, roles = assignment_array(host["tests"], scores.roles, scores.num_layers, scores.num_heads)
  done = computed_roles(scores.sieve_bias, scores.roles)  # a role not computed is left out
  keep = [list(roles).index(r) for r in done if r in roles]
  table = coarse_roles_by_layer(assigned[..., keep], tuple(roles[i] for i in keep))
  log(f"\n{scores.num_sequences} sequences, {scores.num_layers} layers x {scores.num_heads} heads, "
      f"tau = {host['settings']['tau']:g}, alpha = {cfg.alpha:g}, test = {cfg.test}, "
      f"correction = {cfg.correction}, rule = {cfg.rule}")
  if host["settings"].get("num_near_uniform_heads"):
    log(f"near-uniform heads (no role under the calibrated rule): "
        f"{', '.join(host['settings']['near_uniform_heads'])}")
  log(f"heads per role and layer ({cfg.rule} rule):\n" + format_roles_by_layer(table))
  missing = (host["summary"] or {}).get("not_computed") or {}
  if missing:
    log("not computed: " + "; ".join(f"{r} ({why})" for r, why in missing.items()))
  log(headline(host["summary"]))
  if cfg.examples > 0:  # the head view: a second, small forward pass (stats/examples.py)
    load = ((lambda: (model, tokenizer)) if model is not None
            else (lambda: load_model(local_copy(cfg.model))))
    path, computed = write_head_examples(out, load, None, cfg.data, max_length=cfg.max_length,
                                         max_examples=cfg.max_examples, per_head=cfg.examples,
                                         bucket_step=cfg.bucket_step)
    log(f"head view examples: {path}" + ("" if computed else " (unchanged)"))
  report = None
  if cfg.report:
    report = build_analysis_report(out, title=cfg.title)
    log(f"report: {report}")
  elif (out / contract.REPORT_HTML).is_file():  # it shows the earlier tests: stale
    (out / contract.REPORT_HTML).unlink()
    log(f"removed the earlier {contract.REPORT_HTML} (it showed other tests); run without "
        "--no-report for a new one")
  host.update(out=out, report=report)
  return host


def headline(summary: dict) -> str:
  """The paper's summary figures in one console line (the one headline table,
  `heads_jax.report.headline`)."""
  return headline_text(summary)
