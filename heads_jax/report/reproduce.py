"""The report of a ``reproduce`` run: every claim of the papers judged on this run (no jax).

`reproduction_results(workdir)` reads what the stages wrote (``data/splits.json``,
``pretrained/pretrained.json``, ``finetune/<task>/best.json``, ``analysis/analyses.json``,
through `heads_jax.runfiles`, and the analysis and comparison directories through
`heads_jax.contract`) and computes:

* per task and model state (the pre-trained model on the task's sequences; the task's fine-tuned
  model on its own task's): the summary figures under the paper's rule
  (`heads_jax.hoststats.summary`), and the analysis as the claims read it
  (`heads_jax.hoststats.claims.Analysis`: roles by the paper's rule, each head's mean sieve bias
  per role, the clusters);
* Pande et al. Fig. 3 pooled over the tasks, per model state, over the paper's four functional
  roles only (`heads_jax.hoststats.claims.PAPER_ROLES`: local, syntactic, block, delimiter; not
  block_plain, prev/next_local, cls, sep or the single relations);
* the paper table (`paper_table`): one row per claim of `heads_jax.hoststats.claims.CLAIMS`,
  the paper's value as printed, this run's value *on the model state the paper used* (each
  task's fine-tuned model for Pande et al. Figs. 3-5: "For each task, we feed all the input
  sequences to the fine-tuned BERTBASE model", pande2021_heads_hypothesis.txt, "Assigning
  functional roles to heads"; fine-tuned minus pre-trained for Fig. 6), the pre-trained value as
  an extra column, and a verdict (`heads_jax.hoststats.claims.evaluate`);
* fine-tuning: the best dev score per task beside Devlin et al.'s BERT-base.

Roles in the paper table are the paper's rule (mean sieve bias significantly above tau = 3); the
calibrated rule (`heads_jax.hoststats.calibration`) is a heads_jax addition, not the paper's, and
is shown only in its own, so-named column. Syntactic claims read the task text's own parse; a run
without a parser leaves them "not computable here" (its UD EWT fallback analyses, if any, are
not per-task figures and are not used for them).

`write_reproduce_report(workdir, ...)` writes ``report.html`` (self-contained; figures in
``report_figures/``), ``paper_table.csv`` and ``results.json``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract, runfiles, storage
from heads_jax.errors import UserError
from heads_jax.data import vocabulary
from heads_jax.hoststats import claims as paper
from heads_jax.hoststats import pooled as pooled_lib
from heads_jax.hoststats import roles as roles_lib
from heads_jax.report import page
from heads_jax.report.figures import guan as guan_figures
from heads_jax.report.figures import pande as pande_figures

PAIR_TASKS = ("mrpc", "qqp", "qnli")
# The papers' numbers are compared under the paper's role rule (a role when the mean sieve bias
# exceeds tau = 3 significantly); runs that also record the calibrated rule
# (`heads_jax.hoststats.calibration`) show its shares beside them.
RULE = "paper"
CLUSTER_NAMES = ("dense", "diagonal", "dense+vertical", "vertical")


# ------------------------------------------------------------------------------------------------
# reading the run


def _mean(values) -> float | None:
  v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
  return float(np.mean(v)) if v else None


def rule_tests(tests: pd.DataFrame, rule: str = RULE) -> pd.DataFrame:
  """The tests table with ``assigned`` by ``rule`` (its ``assigned_<rule>`` column when the run
  recorded several rules)."""
  col = f"assigned_{rule}"
  return tests.assign(assigned=tests[col]) if col in tests.columns else tests


def rule_summary(summary: dict, rule: str = RULE) -> dict | None:
  """``summary`` with the shares and counts of ``rule`` (``by_rule``); the summary itself when it
  records one rule only; None when it records several but not ``rule``."""
  by_rule = summary.get("by_rule")
  if not by_rule:
    return summary if rule == RULE else None
  if rule not in by_rule:
    return None
  return {**summary, **by_rule[rule], "rule": rule}


def overlap_figures(tests: pd.DataFrame) -> dict:
  """The fine-role overlaps the paper discusses: of the heads with ``nsubj``, how many also have
  ``next_local``; of those with ``obj``, how many also ``prev_local`` (None where not tested)."""
  out = {}
  for role, other in vocabulary.FINE_OVERLAPS:
    tested = set(tests["role"].astype(str))
    if role not in tested or other not in tested:
      out[f"{role}_{other}"] = None
      continue
    a = tests[tests["role"] == role].set_index(["layer", "head"])["assigned"].astype(bool)
    b = tests[tests["role"] == other].set_index(["layer", "head"])["assigned"].astype(bool)
    both = a & b.reindex(a.index, fill_value=False)
    n = int(a.sum())
    out[f"{role}_{other}"] = {"heads": n, "also": int(both.sum()),
                              "share": (float(both.sum() / n) if n else None)}
  return out


def block_heads_by_layer(tests: pd.DataFrame) -> list[int] | None:
  """Heads with the block role per layer (None when block was not tested)."""
  sel = tests[tests["role"].astype(str) == "block"]
  if sel.empty:
    return None
  layers = int(tests["layer"].max()) + 1
  counts = sel[sel["assigned"].astype(bool)].groupby("layer").size()
  return [int(counts.get(i, 0)) for i in range(layers)]


def _head_array(tests: pd.DataFrame, roles, column: str, num_layers: int, num_heads: int,
                fill) -> np.ndarray:
  """``[l, h, r]`` of one column of a tests table (``fill`` where a row is missing)."""
  out = np.full((num_layers, num_heads, len(roles)), fill,
                dtype=bool if isinstance(fill, bool) else np.float64)
  index = {r: i for i, r in enumerate(roles)}
  r = np.asarray([index[x] for x in tests["role"].astype(str)], np.int64)
  out[tests["layer"].to_numpy(np.int64), tests["head"].to_numpy(np.int64), r] = tests[column].to_numpy()
  return out


def _median_scores(out_dir, roles, num_layers: int, num_heads: int) -> np.ndarray | None:
  """Each head's median sieve bias per role ``[l, h, r]`` (roles in ``roles`` order; NaN where
  the run has no such role or no defined score) from scores.npz, or None without the file."""
  try:
    s = contract.read_scores(out_dir)
  except (FileNotFoundError, ValueError):
    return None
  out = np.full((num_layers, num_heads, len(roles)), np.nan)
  bias = np.asarray(s.sieve_bias, np.float64)
  names = list(s.roles)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)     # all-NaN heads (a role undefined)
    for i, r in enumerate(roles):
      if r in names:
        out[..., i] = np.nanmedian(bias[..., names.index(r)], axis=0)
  return out


def analysis_of(out_dir, rule: str = RULE) -> paper.Analysis:
  """One analysis directory as the claims read it (`heads_jax.hoststats.claims.Analysis`): roles by
  ``rule`` (the paper's by default), each head's mean and median sieve bias per role, the summary
  under that rule, the clusters, their stability and info, each head's distance features
  (attention masses) and its mean row entropy (measures.npz, where the run has one)."""
  tests, settings = contract.read_tests(out_dir)
  tests = rule_tests(tests, rule)
  roles = roles_lib.role_order(tests["role"].astype(str))
  num_layers, num_heads = int(tests["layer"].max()) + 1, int(tests["head"].max()) + 1
  assigned, _ = roles_lib.assignment_array(tests, roles, num_layers, num_heads)
  means = _head_array(tests, roles, "mean", num_layers, num_heads, np.nan)
  summary = rule_summary(contract.read_summary(out_dir), rule) or {}
  clusters, stability, features, info = None, None, None, None
  if contract.has_clusters(out_dir):
    table, info = contract.read_clusters(out_dir)
    layer, head = table["layer"].to_numpy(np.int64), table["head"].to_numpy(np.int64)
    clusters = np.full((num_layers, num_heads), "", dtype=object)
    clusters[layer, head] = table["cluster_name"].astype(str).to_numpy()
    features = np.full((num_layers, num_heads, len(vocabulary.DISTANCE_FEATURES)), np.nan)
    features[layer, head] = table[list(vocabulary.DISTANCE_FEATURES)].to_numpy(np.float64)
    stability = info.get("stability")
  entropy = None
  if (Path(out_dir) / contract.MEASURES_FILE).is_file():
    measured = contract.read_measures(out_dir)["entropy"]                   # [b, l, h]
    if measured.shape[1:] == (num_layers, num_heads):
      entropy = np.asarray(measured, np.float64).mean(0)
  return paper.Analysis(roles=roles, assigned=assigned, means=means,
                        tau=float(settings.get("tau", 3.0)), summary=summary, clusters=clusters,
                        stability=stability,
                        medians=_median_scores(out_dir, roles, num_layers, num_heads),
                        features=features, cluster_info=info, entropy=entropy)


def analysis_figures_of(out_dir) -> dict:
  """Everything the report needs from one analysis directory."""
  out_dir = Path(out_dir)
  tests, settings = contract.read_tests(out_dir)
  tests = rule_tests(tests)
  raw = contract.read_summary(out_dir)
  summary = rule_summary(raw)
  a = analysis_of(out_dir)
  result = {"out": str(out_dir), "summary": summary, "calibrated": rule_summary(raw, "calibrated"),
            "tau": settings.get("tau"),
            "overlaps": overlap_figures(tests), "block_by_layer": block_heads_by_layer(tests),
            "num_block_heads": (None if "block" not in set(tests["role"].astype(str)) else
                                int(tests[(tests["role"] == "block")]["assigned"].astype(bool).sum())),
            "analysis": a}
  if a.clusters is not None:
    result["cluster_shares"] = {n: float((a.clusters == n).mean()) for n in CLUSTER_NAMES}
    result["cluster_stability"] = a.stability
  else:
    result["cluster_shares"], result["cluster_stability"] = None, None
  return result


def paper_pool(dirs) -> dict:
  """Pande et al. Fig. 3 pooled over analysis directories, over the paper's four functional roles
  (`heads_jax.hoststats.claims.PAPER_ROLES`; the Fig. 3 caption: "144 x |tasks| x |roles| x |num
  sents| scores"): `heads_jax.hoststats.pooled.pooled_figures` of their sieve bias scores and of
  their tests' unadjusted p-values, plus ``roles`` (those pooled)."""
  scores, pvals, pooled_roles = [], [], set()
  for d in dirs:
    s = contract.read_scores(d)
    names = list(s.roles)
    idx = [names.index(r) for r in paper.PAPER_ROLES if r in names]
    pooled_roles |= {names[i] for i in idx}
    scores.append(np.asarray(s.sieve_bias)[..., idx])
    t = contract.read_tests(d)[0]
    pvals.append(t.loc[t["role"].astype(str).isin(paper.PAPER_ROLES), "p_value"].to_numpy(np.float64))
  out = pooled_lib.pooled_figures(scores, pvals)
  out["roles"] = [r for r in paper.PAPER_ROLES if r in pooled_roles]
  return out


def reproduction_results(workdir, tasks=None) -> dict:
  """The run's numbers (see the module docstring); JSON-able except the pooled arrays and the
  ``analysis`` objects."""
  workdir = Path(workdir)
  analyses = runfiles.read_analyses(workdir) or {"units": {}, "parser": None}
  units = analyses["units"]
  splits = runfiles.read_splits(workdir) or {}
  if tasks is None:
    tasks = [u["task"] for k, u in units.items() if k.startswith("pretrained/") and
             not u.get("syntax_fallback")]
  tasks = list(tasks)
  per = {"pretrained": {}, "finetuned": {}}
  for name, u in units.items():
    if u.get("syntax_fallback") or u["task"] not in tasks:
      continue
    if not (Path(u["out"]) / contract.SUMMARY_JSON).is_file():
      continue
    fig = analysis_figures_of(u["out"])
    fig["data"] = u["data"]
    per[u["model_kind"]][u["task"]] = fig
  pooled = {k: paper_pool([per[k][t]["out"] for t in tasks if t in per[k]]) for k in per}
  finetune = {t: runfiles.read_best(workdir, t) for t in tasks}
  return {"workdir": str(workdir), "tasks": tasks, "parser": analyses.get("parser"),
          "per_task": per, "pooled": pooled, "splits": splits,
          "pretrained": runfiles.read_pretrained(workdir),
          "finetune": finetune, "config": runfiles.read_reproduce_config(workdir)}


# ------------------------------------------------------------------------------------------------
# the paper table


def run_figures(results: dict, rule: str = RULE) -> paper.RunFigures:
  """The run as `heads_jax.hoststats.claims.evaluate` reads it, roles by ``rule``."""
  if rule == RULE:
    analyses = {k: {t: f["analysis"] for t, f in v.items()} for k, v in results["per_task"].items()}
  else:
    analyses = {k: {t: analysis_of(f["out"], rule) for t, f in v.items()}
                for k, v in results["per_task"].items()}
  pooled = {k: {key: v.get(key) for key in ("mean_sieve_score", "auto_tau", "share_p_between",
                                            "num_p_values")}
            for k, v in results["pooled"].items()}
  finetune = {}
  for t, best in (results.get("finetune") or {}).items():
    if best and best.get("best"):
      finetune[t] = {k: v for k, v in best["best"].items() if isinstance(v, (int, float))}
      labels = best.get("eval_labels") or {}   # the bar a fine-tuning verdict needs
      finetune[t].update({k: labels[k] for k in ("majority", "n") if labels.get(k) is not None})
  model = (results.get("pretrained") or {}).get("model")
  return paper.RunFigures(tasks=tuple(results["tasks"]), analyses=analyses, pooled=pooled,
                          finetune=finetune, model=Path(str(model or "")).name,
                          bert_base=is_bert_base(model))


def is_bert_base(model) -> bool:
  """Whether ``model`` (a model directory or cached hub id) is Pande et al.'s model, BERT-base:
  decided from its config, never its shape alone: the BERT family (``model_type`` "bert") with
  BERT-base's sizes (12 layers, 12 heads, hidden 768, intermediate 3072; `heads_jax.model.config.
  SIZES` "base"). False when the config cannot be read (a model not known to be BERT-base: its
  numbers are shown, not judged)."""
  import json
  from heads_jax import hub
  from heads_jax.model import config as model_config
  if not model:
    return False
  try:
    path = hub.model_path(model)
    manifest = Path(path) / "heads_jax.json"
    cfg = (model_config.config_from_dict(json.loads(manifest.read_text())["config"])
           if manifest.is_file() else model_config.config_from_hf_file(Path(path) / "config.json"))
  except (OSError, ValueError, KeyError, TypeError, UserError):
    return False
  sizes = (cfg.num_layers, cfg.num_heads, cfg.hidden_size, cfg.intermediate_size)
  return getattr(cfg, "family", None) == "bert" and sizes == model_config.SIZES["base"]


def _shown(c: paper.Claim, value) -> str:
  if value is None:
    return ""
  if isinstance(value, str):
    return value
  if c.kind == "text":
    return str(value)
  return paper.format_value(c.kind, value)


# The columns of the report's paper table (paper_table.csv has these and more).
PAPER_COLUMNS = ("paper", "claim", "paper_value", "this_run", "verdict", "this_run_pretrained",
                 "difference", "model", "detail", "source")
MODEL_TEXT = {"finetuned": "fine-tuned (per task)", "pretrained": "pre-trained",
              "change": "fine-tuned minus pre-trained"}


def paper_table(results: dict) -> pd.DataFrame:
  """One row per claim (`heads_jax.hoststats.claims.CLAIMS`): the paper's value as printed, this
  run's value on the claim's model state, the verdict and what it was computed over (or why it
  could not be), this run's pre-trained value, the difference (numbers), the quoted sentence and
  the rule; and, for the share claims of Pande et al., the share under heads_jax's calibrated
  rule (a heads_jax addition, not the paper's rule)."""
  run = run_figures(results)
  calibrated = None
  if any(f.get("calibrated") for v in results["per_task"].values() for f in v.values()):
    try:
      calibrated = run_figures(results, "calibrated")
    except (KeyError, ValueError):
      calibrated = None
  rows = []
  for c, e in paper.evaluate_all(run):
    cal = ""
    if calibrated is not None and c.kind == "share" and c.paper == paper.PANDE and c.summary_key \
        and c.summary_key.startswith("share_") and c.summary_key != "share_p_between":
      ce = paper.evaluate(c, calibrated)
      cal = _shown(c, ce.value) if ce.verdict != paper.NOT_COMPUTABLE else ""
    rows.append({
        "key": c.key, "paper": c.paper.split(" (")[0].split(",")[0], "claim": c.text,
        "paper_value": paper.format_paper_value(c),
        "this_run": _shown(c, e.value) if e.verdict != paper.NOT_COMPUTABLE else "",
        "verdict": e.verdict, "this_run_pretrained": _shown(c, e.pretrained),
        "difference": paper.format_difference(c, paper.difference(c, e.value)),
        "model": MODEL_TEXT[c.model], "detail": e.detail, "source": c.source,
        "quote": c.quote, "rule": c.rule, "measure": c.measure, "note": c.note,
        "calibrated_rule_heads_jax": cal,
        "value_paper": _rounded(c.value),
        "value_this_run": _rounded(e.value),
        "value_pretrained": _rounded(e.pretrained)})
  return pd.DataFrame(rows)


def _rounded(x, digits: int = 6):
  """A number for the CSV without float noise (0.8284999999999999 -> 0.8285), else None."""
  if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
    return None
  x = float(x)
  return round(x, digits) if math.isfinite(x) else None


def markdown_table(table: pd.DataFrame) -> str:
  """README's paper table from a run's paper table (``paper_table.csv``): the rows with a value
  (every verdict but "not computable here"), columns claim, paper, this run (fine-tuned),
  pre-trained, verdict."""
  shown = table[table["verdict"] != paper.NOT_COMPUTABLE]
  lines = ["| claim | paper | this run (fine-tuned) | pre-trained | verdict |",
           "|---|---|---|---|---|"]
  for _, r in shown.iterrows():
    cells = [r["claim"], r["paper_value"], r["this_run"], r["this_run_pretrained"], r["verdict"]]
    lines.append("| " + " | ".join("" if pd.isna(c) else str(c).replace("|", "/")
                                   for c in cells) + " |")
  return "\n".join(lines)


def verdict_counts(table: pd.DataFrame) -> dict:
  """How many claims have each verdict (`heads_jax.hoststats.claims.VERDICTS`: hold, do not
  hold, undecided at this n, not computable here, not comparable)."""
  counts = table["verdict"].value_counts()
  return {v: int(counts.get(v, 0)) for v in paper.VERDICTS}


def _by_task(results: dict, per_task: dict):
  """``(task, entry)`` for each task of the run, in order, that has an entry in ``per_task``
  (``{task: entry}``; an empty entry counts as none)."""
  for t in results["tasks"]:
    if per_task.get(t):
      yield t, per_task[t]


def _analyses(results: dict, kinds):
  """``(kind, task, analysis figures)`` for each model state of ``kinds`` (``"pretrained"``,
  ``"finetuned"``) and each task analysed in that state, in that order."""
  for kind in kinds:
    for t, fig in _by_task(results, results["per_task"][kind]):
      yield kind, t, fig


def finetune_table(results: dict) -> pd.DataFrame:
  """Per task: the best grid point (by the task's selection metric) and, at its best evaluation,
  the metric Devlin et al. report for BERT-base on dev, beside theirs."""
  rows = []
  for t, best in _by_task(results, results["finetune"]):
    metric = best["metric"]
    dev = paper.devlin_dev(t)
    ref = dev.value if dev is not None else None
    mine = best["best"].get(dev.metric) if dev is not None else None
    test = next((x for x in paper.DEVLIN_DEV.get(t, ()) if x.split == "test"), None)
    eval_role = (results["splits"].get(t) or {}).get("roles", {}).get("eval", {})
    rows.append({
        "task": paper.TASK_NAMES[t], "best run": best["best_run"],
        "selected by": f"{metric} {paper.format_value('share', best['score'])}",
        "evaluated on": (f"{eval_role.get('rows', 0):,} rows of {eval_role.get('split', '?')}"
                         if eval_role else ""),
        "metric": dev.metric if dev is not None else metric,
        "this run": paper.format_value("share", mine if dev is not None else best["score"]),
        "Devlin et al. BERT-base (dev)": (paper.format_value("share", ref) if ref is not None else
                                          "not reported" + (f" (GLUE test {test.metric} "
                                                            f"{paper.format_value('share', test.value)})"
                                                            if test else "")),
        "difference": (f"{100 * (mine - ref):+.1f} pp" if ref is not None and mine is not None
                       else "n/a"),
        "grid": "; ".join(f"{k}: {v['metric']} {100 * v['score']:.1f}" for k, v in best["grid"].items()),
        "source": dev.source if dev is not None else paper.DEVLIN})
  return pd.DataFrame(rows)


def task_table(results: dict) -> pd.DataFrame:
  """Per task and model state: the headline figures under the paper's rule, coarse roles from the
  paper's four tests, the mean sieve score and the p-values in (0.05, 0.95) over the paper's four
  roles."""
  rows = []
  for kind, t, fig in _analyses(results, ("finetuned", "pretrained")):
    shares = fig["analysis"].shares()
    pool = paper_pool([fig["out"]])
    row = {"task": paper.TASK_NAMES[t], "model": MODEL_TEXT[kind],
           "sequences": fig["summary"].get("num_sequences")}
    for k in ("share_delimiter", "share_local", "share_syntactic", "share_block",
              "share_unskilled", "share_syntactic_also_local"):
      row[k] = paper.format_value("share", shares[k])
    row["spearman_local_syntactic"] = paper.format_value(
        "corr", fig["summary"].get("spearman_local_syntactic"))
    row["mean_sieve_score"] = paper.format_value("float", pool["mean_sieve_score"])
    row["share_p_between"] = paper.format_value("share", pool["share_p_between"])
    rows.append(row)
  return pd.DataFrame(rows)


def overlap_table(results: dict) -> pd.DataFrame:
  rows = []
  for kind, t, fig in _analyses(results, ("finetuned", "pretrained")):
    row = {"task": paper.TASK_NAMES[t], "model": MODEL_TEXT[kind]}
    for key, label in (("nsubj_next_local", "nsubj heads also next_local"),
                       ("obj_prev_local", "obj heads also prev_local")):
      o = fig["overlaps"].get(key)
      row[label] = ("not tested (no parse of the task text)" if o is None else
                    f"{o['also']} of {o['heads']}" + (f" ({100 * o['share']:.0f}%)" if o["share"] is not None else ""))
    rows.append(row)
  return pd.DataFrame(rows)


def cluster_table(results: dict) -> pd.DataFrame:
  rows = []
  for kind, t, fig in _analyses(results, ("pretrained", "finetuned")):
    if not fig["cluster_shares"]:
      continue
    row = {"task": paper.TASK_NAMES[t], "model": kind}
    row.update({n: paper.format_value("share", v) for n, v in fig["cluster_shares"].items()})
    row["stability"] = paper.format_value("share", fig["cluster_stability"])
    info = fig["analysis"].cluster_info or {}
    margins = dict(zip(info.get("names") or [], info.get("name_margins") or []))
    row["name margins"] = ", ".join(f"{n} {m:+.3f}" for n, m in margins.items())
    row["flagged"] = ", ".join(info.get("low_margin") or []) or "none"
    row["outlier heads"] = ", ".join(f"{o['layer']}:{o['head']} ({o['cluster_name']})"
                                     for o in info.get("outliers") or []) or "none"
    rows.append(row)
  return pd.DataFrame(rows)


def splits_table(results: dict) -> pd.DataFrame:
  rows = []
  for t, s in _by_task(results, results["splits"]):
    r = s["roles"]
    rows.append({"task": paper.TASK_NAMES[t], "source": s["source"], "from": s["origin"],
                 "fine-tuning (train)": f"{r['train']['rows']:,} rows of {r['train']['split']}",
                 "evaluation (dev score)": f"{r['eval']['rows']:,} rows of {r['eval']['split']}",
                 "analysis": f"first {r['analysis']['rows']:,} rows of {r['analysis']['split']}",
                 "shared splits (disjoint rows)": "; ".join(
                     f"{k}: {', '.join(v)}" for k, v in s.get("shared_splits", {}).items()) or "none"})
  return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# the page


def coarse_flags(a: paper.Analysis) -> pd.DataFrame:
  """One row per head (layer, head) with a bool column per coarse role the run tested: the
  paper's four tests (`heads_jax.hoststats.claims.PAPER_ROLES`)."""
  coarse, names = a.coarse()
  l, h = coarse.shape[:2]
  layer, head = np.indices((l, h)).reshape(2, -1)
  flags = pd.DataFrame({"layer": layer, "head": head})
  for i, n in enumerate(names):
    flags[n] = coarse[..., i].reshape(-1)
  return flags


def _figures(results: dict, fig_dir: Path) -> dict:
  """Draws the report's figures; returns ``{name: (path, title, caption)}``."""
  figs = {}
  tau = float((results.get("config") or {}).get("analysis", {}).get("tau", 3.0))
  alpha = float((results.get("config") or {}).get("analysis", {}).get("alpha", 0.05))
  pooled = results["pooled"]["finetuned"]
  n_tasks = len(results["per_task"]["finetuned"])
  roles = ", ".join(pooled.get("roles") or ())
  if pooled["num_scores"]:
    figs["pooled_cdf"] = (pande_figures.plot_score_cdf(
        pooled["scores"], fig_dir / "pooled_score_cdf.png", tau=tau, mean=pooled["mean_sieve_score"],
        title=f"Fig. 3 (left): sieve bias scores of the fine-tuned models, {n_tasks} task(s) pooled"),
        "All sieve bias scores of the four functional roles, pooled over the tasks (Pande et al. Fig. 3a)",
        f"Cumulative share of every sieve bias score (sequence x head x role; roles {roles}) of "
        "each task's fine-tuned model on its own task's sequences; the paper: mean around 2.8, "
        "tau = 3.")
  if pooled["num_p_values"]:
    figs["pooled_p"] = (pande_figures.plot_pvalue_hist(
        pooled["p_values"], fig_dir / "pooled_pvalue_hist.png", alpha=alpha,
        title=f"Fig. 3 (right): p-values of the fine-tuned models' tests, {n_tasks} task(s) pooled"),
        "All p-values of the four functional roles, pooled over the tasks (Pande et al. Fig. 3b)",
        f"p-values of every (task, layer, head, role) test (roles {roles}) of the fine-tuned "
        "models; the paper: 1.8% lie in (0.05, 0.95).")
  for t in results["tasks"]:
    name = paper.TASK_NAMES[t]
    for kind in ("finetuned", "pretrained"):
      fig = results["per_task"][kind].get(t)
      if fig is None:
        continue
      tests = rule_tests(contract.read_tests(fig["out"])[0])
      flags = coarse_flags(fig["analysis"])
      sets = [c for c in paper.PAPER_ROLES if c in flags.columns]
      what = MODEL_TEXT[kind].split(" (")[0]
      figs[f"venn_{t}_{kind}"] = (pande_figures.plot_role_venn(
          flags, fig_dir / f"venn_{t}_{kind}.png", sets=tuple(sets),
          title=f"{name}, {what}: heads per coarse role"),
          f"{name}, {what}: overlap of the four coarse roles (Fig. 4)",
          "Each ellipse is the heads whose coarse test rejects (local, syntactic, block, "
          "delimiter: the paper's four tests, not unions of finer roles); numbers count heads.")
      figs[f"upset_{t}_{kind}"] = (pande_figures.plot_role_upset(
          flags, fig_dir / f"upset_{t}_{kind}.png", sets=tuple(sets),
          title=f"{name}, {what}: coarse role combinations"),
          f"{name}, {what}: every combination of the coarse roles (Fig. 4 as an UpSet plot)", "")
      figs[f"grid_{t}_{kind}"] = (pande_figures.plot_role_grid(
          tests, fig_dir / f"grid_{t}_{kind}.png", title=f"{name}, {what}: roles per layer and head"),
          f"{name}, {what}: the Fig. 5 roles per layer and head (Fig. 5)",
          "The paper's Fig. 5 roles: [CLS], [SEP], nsubj, dobj, amod, advmod, previous and next "
          "tokens, block; heads sorted within a layer by their number of roles.")
    cmp_dir = Path(results["workdir"]) / "compare" / t
    if (cmp_dir / contract.COMPARE_JSON).is_file():
      comparison = contract.read_comparison(cmp_dir)
      figs[f"delta_{t}"] = (pande_figures.plot_finetune_delta(
          comparison.sieve_bias, fig_dir / f"delta_{t}.png",
          title=f"{name}: change of mean sieve bias after fine-tuning"),
          f"{name}: change of the mean sieve bias after fine-tuning (Fig. 6)",
          "Per role and layer group (initial, middle, final thirds of the layers): mean sieve "
          "bias of the fine-tuned model minus the pre-trained model's, on the same sequences.")
  first = next((results["per_task"]["finetuned"][t] for t in results["tasks"]
                if t in results["per_task"]["finetuned"]), None)
  if first is not None and first["cluster_shares"]:
    clusters, _ = contract.read_clusters(first["out"])
    figs["clusters"] = (guan_figures.plot_cluster_layers(
        clusters, fig_dir / "cluster_layers.png",
        title="Cluster type per layer, first task's fine-tuned model"),
        "Guan et al.: attention types per layer (Fig. 3), a fine-tuned model", "")
  return figs


def _fig(figs: dict, name: str) -> str:
  if name not in figs:
    return ""
  path, title, caption = figs[name]
  return page.figure_html(path, title, caption, name=name)


def _link(workdir: Path, target, text: str) -> str:
  target = Path(target)
  if not target.is_file():
    return ""
  rel = target.relative_to(workdir) if target.is_relative_to(workdir) else target
  return f'<a href="{page.esc(rel.as_posix())}">{page.esc(text)}</a>'


def write_reproduce_report(workdir, *, config: dict | None = None, tasks=None) -> dict:
  """Writes ``report.html``, ``paper_table.csv`` and ``results.json`` into ``workdir``;
  returns their paths (``report``, ``paper_table``, ``results``) and the paper table rows."""
  workdir = Path(workdir)
  results = reproduction_results(workdir, tasks)
  if config is not None:
    results["config"] = config
  table = paper_table(results)
  with storage.naming(workdir / "paper_table.csv"):
    table.to_csv(workdir / "paper_table.csv", index=False)
  fig_dir = workdir / "report_figures"
  figs = _figures(results, fig_dir)
  cfg = results.get("config") or {}
  pre = results.get("pretrained") or {}
  parser = results.get("parser")
  fb = (cfg.get("analysis") or {}).get("syntax_fallback")
  setup = [("preset", cfg.get("preset")), ("tasks", ", ".join(paper.TASK_NAMES[t] for t in results["tasks"])),
           ("pre-trained model", f"{pre.get('what', '?')}: {pre.get('model', '?')}"),
           ("fine-tuning grid", f"batch {tuple((cfg.get('finetune') or {}).get('batch_sizes', ()))} x "
                                f"learning rate {tuple((cfg.get('finetune') or {}).get('learning_rates', ()))}, "
                                f"{(cfg.get('finetune') or {}).get('num_train_steps')} steps, "
                                f"{(cfg.get('finetune') or {}).get('warmup_steps')} warm-up, LAMB"),
           ("analysed sequences per task", cfg.get("test_sequences")),
           ("parser", parser if parser != "none" else
            "none: the task text has no dependency arcs, so the syntactic claims are not "
            "computable here" + (f" (the {fb} analyses with gold arcs are in analysis/, not "
                                 "per-task figures)" if fb else "")),
           ("test", f"one-sided {(cfg.get('analysis') or {}).get('test', 't')}-test, tau = "
                    f"{(cfg.get('analysis') or {}).get('tau')}, alpha = {(cfg.get('analysis') or {}).get('alpha')}, "
                    f"correction {(cfg.get('analysis') or {}).get('correction')}")]
  counts = verdict_counts(table)
  sections = [
      ("Setup", page.kv_table_html(setup, table_id="table-setup")
       + page.kv_table_html(list(paper.PANDE_SETUP.items()), table_id="table-paper-setup",
                            headers=("the paper", "setting"))),
      ("Splits: which rows each stage used",
       "<p>Fine-tuning never trains on rows that are evaluated or analysed; where two stages read "
       "the same split they get disjoint rows (data/splits.json lists them).</p>"
       + page.table_html(splits_table(results), table_id="table-splits")
       + "".join(f"<p class=\"note\">{page.esc(paper.TASK_NAMES[t])}: "
                 f"{page.esc((results['splits'].get(t) or {}).get('describe', ''))}</p>"
                 for t in results["tasks"])),
      ("The papers' claims judged on this run",
       "<p>Every claim of Pande et al. (2021, and the first author's blog post) and Guan et al. "
       "(2020), numbers and statements, each with the sentence it rests on (paper_table.csv: "
       "<i>quote</i>, <i>rule</i>, <i>measure</i>). <i>this_run</i> is computed on the model "
       "state the paper used: each task's fine-tuned model on its own task's sequences (\"For "
       "each task, we feed all the input sequences to the fine-tuned BERTBASE model\"), or the "
       "change after fine-tuning for Fig. 6; <i>this_run_pretrained</i> is the pre-trained model "
       "on the same sequences. Roles are the paper's rule (mean sieve bias significantly above "
       "tau) and the paper's four coarse tests. Verdicts follow the rules of DESIGN.md section 3 "
       f"(\"Verdicts\"): {counts[paper.HOLDS]} hold, {counts[paper.FAILS]} do not hold, "
       f"{counts[paper.UNDECIDED]} are undecided at this n (a statement judged on a share whose "
       "bar, or base rate, lies inside its 95% interval or exact test: the sample cannot tell), "
       f"{counts[paper.NOT_COMPUTABLE]} are not computable here (the reason is in "
       f"<i>detail</i>), {counts[paper.NOT_COMPARABLE_MODEL]} are not comparable because "
       "this is not Pande et al.'s model (BERT-base: their numbers and layer placements are "
       "shown beside this run's without a verdict; statements about the method are still "
       f"judged) and {counts[paper.NOT_COMPARABLE]} are not comparable: Guan et al. "
       "analysed BERT-large fine-tuned on SQuAD, so their rows show this run's value without a "
       "verdict (the guan pipeline, <code>configs/reproduce.py:guan</code>, judges them in their "
       "setting).</p>"
       + page.table_html(table[list(PAPER_COLUMNS)], table_id="table-paper")),
      ("Fine-tuning: best dev score per task",
       "<p>The best evaluation of each grid point is kept; the table gives the best grid point per "
       "task beside Devlin et al.'s BERT-base dev score (their Table 5; QQP dev is not reported "
       "there). The evaluation rows are the ones in the Splits table, which for some presets are "
       "not GLUE's dev set.</p>" + page.table_html(finetune_table(results), table_id="table-finetune")),
      ("Fig. 3: all scores and p-values, pooled over the tasks", _fig(figs, "pooled_cdf") + _fig(figs, "pooled_p")),
      ("The calibrated rule (a heads_jax addition, not the paper's)",
       "<p>heads_jax also records a rule calibrated against uniform attention "
       "(DESIGN.md section 3, \"Role rules\"): it is not the paper's rule, so the claims above "
       "are judged by the paper's rule; for the share claims, <i>calibrated_rule_heads_jax</i> in "
       "paper_table.csv gives the share under it.</p>"
       + page.table_html(table.loc[table["calibrated_rule_heads_jax"] != "",
                                   ["claim", "paper_value", "this_run", "calibrated_rule_heads_jax"]],
                         table_id="table-calibrated")),
      ("Headline figures per task", page.table_html(task_table(results), table_id="table-tasks")),
      ("Fine-role overlaps: nsubj with next_local, obj with prev_local",
       "<p>A dependent usually precedes its head in a subject relation and follows it in an "
       "object relation, so the paper finds nsubj heads that also attend to the next tokens and "
       "obj heads that also attend to the previous ones.</p>"
       + page.table_html(overlap_table(results), table_id="table-overlaps")),
  ]
  for t in results["tasks"]:
    name = paper.TASK_NAMES[t]
    links = [_link(workdir, Path(results["per_task"][k][t]["out"]) / contract.REPORT_HTML, f"{k} analysis report")
             for k in ("pretrained", "finetuned") if t in results["per_task"][k]]
    links.append(_link(workdir, workdir / "compare" / t / contract.REPORT_HTML, "comparison report"))
    links = [x for x in links if x]
    body = (f"<p>{' | '.join(links)}</p>" if links else "")
    body += "".join(_fig(figs, f"{p}_{t}_{k}") for p in ("venn", "upset", "grid")
                    for k in ("finetuned", "pretrained"))
    body += _fig(figs, f"delta_{t}")
    sections.append((f"{name}: Figs. 4-6", body))
  sections.append(("Guan et al.: attention types (clusters) and their stability",
                   "<p>Share of heads per cluster type (K-means, k = 4, on the 21 distance "
                   "features; each type named by Guan et al.'s definition, with the margin by "
                   "which it holds, flagged below 0.02; clusters under 3% of the heads set aside "
                   "and refit, their heads joined to the nearest type: DESIGN.md section 3) and "
                   "the stability of the clustering (fraction of heads whose cluster is the same "
                   "in all 10 fits on random halves of the heads). These are the run's own "
                   "models on GLUE: Guan et al.'s rows in the paper table are not comparable.</p>"
                   + page.table_html(cluster_table(results), table_id="table-clusters")
                   + _fig(figs, "clusters")))
  report = page.write_page(workdir, title="Reproduction of Pande et al. (AAAI 2021)",
                           subtitle=f"heads-jax reproduce, preset {cfg.get('preset')}: "
                                    f"{', '.join(paper.TASK_NAMES[t] for t in results['tasks'])}",
                           sections=sections)
  out = {k: v for k, v in results.items() if k not in ("pooled", "per_task")}
  out["pooled"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("scores", "p_values")}
                   for k, v in results["pooled"].items()}
  out["per_task"] = {k: {t: {kk: vv for kk, vv in f.items() if kk != "analysis"}
                         for t, f in v.items()} for k, v in results["per_task"].items()}
  out["paper_table"] = table.to_dict(orient="records")
  out["verdicts"] = counts
  out["finetune_table"] = finetune_table(results).to_dict(orient="records")
  contract.write_json(out, workdir / "results.json")
  return {"report": str(report), "paper_table": str(workdir / "paper_table.csv"),
          "results": str(workdir / "results.json")}
