"""The report of a ``reproduce`` run: every number of the papers beside this run's (no jax).

`reproduction_results(workdir)` reads what the stages wrote (``data/splits.json``,
``pretrained/pretrained.json``, ``finetune/<task>/best.json``, ``analysis/analyses.json`` and the
analysis and comparison directories through `heads_jax.contract`) and computes:

* the pooled figures of Pande et al. Fig. 3: all sieve bias scores and all p-values of the
  pre-trained model over the tasks, their mean, the paper's tau rule applied to it, and the share
  of p-values in (0.05, 0.95) (also for the fine-tuned models, pooled the same way);
* per task and model (pre-trained on the task's sequences; fine-tuned on its own task): the
  summary figures (`heads_jax.hoststats.summary`), block heads per layer, the fine-role overlaps
  the paper discusses (nsubj heads that are also next_local, obj heads that are also
  prev_local), and Guan et al.'s cluster shares and clustering stability;
* the paper table: every claim of `heads_jax.hoststats.paper.CLAIMS` with the paper's value,
  this run's value for the pre-trained and the fine-tuned models, and the difference (taken for
  the model the claim is about);
* fine-tuning: the best dev score per task beside Devlin et al.'s BERT-base.

When the task sequences were analysed without a parser and the run has syntax-fallback analyses
(gold arcs, e.g. UD EWT), the syntactic figures come from those, and the table says so.

`write_reproduce_report(workdir, ...)` writes ``report.html`` (self-contained; figures in
``report_figures/``), ``paper_table.csv`` and ``results.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.hoststats import paper
from heads_jax.hoststats import pooled as pooled_lib
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


def _read_json(path: Path):
  return json.loads(Path(path).read_text()) if Path(path).is_file() else None


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
  for role, other in (("nsubj", "next_local"), ("obj", "prev_local")):
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


def analysis_figures_of(out_dir) -> dict:
  """Everything the report needs from one analysis directory."""
  out_dir = Path(out_dir)
  tests, settings = contract.read_tests(out_dir)
  tests = rule_tests(tests)
  raw = contract.read_summary(out_dir)
  summary = rule_summary(raw)
  result = {"out": str(out_dir), "summary": summary, "calibrated": rule_summary(raw, "calibrated"),
            "tau": settings.get("tau"),
            "overlaps": overlap_figures(tests), "block_by_layer": block_heads_by_layer(tests),
            "num_block_heads": (None if "block" not in set(tests["role"].astype(str)) else
                                int(tests[(tests["role"] == "block")]["assigned"].astype(bool).sum()))}
  try:
    clusters, info = contract.read_clusters(out_dir)
    counts = clusters["cluster_name"].astype(str).value_counts()
    result["cluster_shares"] = {n: float(counts.get(n, 0) / len(clusters)) for n in CLUSTER_NAMES}
    result["cluster_stability"] = info.get("stability")
  except FileNotFoundError:
    result["cluster_shares"], result["cluster_stability"] = None, None
  return result


def _pooled(dirs) -> dict:
  """Fig. 3 pooled over analysis directories (`heads_jax.hoststats.pooled.pooled_figures`)."""
  scores, pvals = [], []
  for d in dirs:
    scores.append(contract.read_scores(d).sieve_bias)
    pvals.append(contract.read_tests(d)[0]["p_value"].to_numpy(np.float64))
  return pooled_lib.pooled_figures(scores, pvals)


def reproduction_results(workdir, tasks=None) -> dict:
  """The run's numbers (see the module docstring); JSON-able except the pooled arrays."""
  workdir = Path(workdir)
  analyses = _read_json(workdir / "analysis" / "analyses.json") or {"units": {}, "parser": None}
  units = analyses["units"]
  splits = _read_json(workdir / "data" / "splits.json") or {}
  if tasks is None:
    tasks = [u["task"] for k, u in units.items() if k.startswith("pretrained/") and
             not u.get("syntax_fallback")]
  tasks = list(tasks)
  per = {"pretrained": {}, "finetuned": {}}
  fallback = {"pretrained": {}, "finetuned": {}}
  for name, u in units.items():
    if not (Path(u["out"]) / contract.SUMMARY_JSON).is_file():
      continue
    fig = analysis_figures_of(u["out"])
    fig["data"] = u["data"]
    kind = u["model_kind"]
    if u.get("syntax_fallback"):
      # the pre-trained model's fallback analysis serves every task
      for t in (tasks if kind == "pretrained" else [u["task"]]):
        fallback[kind][t] = fig
    elif u["task"] in tasks:
      per[kind][u["task"]] = fig
  pooled = {k: _pooled([per[k][t]["out"] for t in tasks if t in per[k]]) for k in per}
  finetune = {t: _read_json(workdir / "finetune" / t / "best.json") for t in tasks}
  return {"workdir": str(workdir), "tasks": tasks, "parser": analyses.get("parser"),
          "per_task": per, "syntax_fallback": fallback, "pooled": pooled, "splits": splits,
          "pretrained": _read_json(workdir / "pretrained" / "pretrained.json"),
          "finetune": finetune, "config": _read_json(workdir / "reproduce_config.json")}


# ------------------------------------------------------------------------------------------------
# the paper table


def _syntactic(results: dict, kind: str, task: str) -> tuple[dict | None, str]:
  """The figures the syntactic claims read for (model kind, task), and where they come from."""
  fig = results["per_task"][kind].get(task)
  if fig is not None and fig["summary"].get("share_syntactic") is not None:
    return fig, "task sequences"
  fb = results["syntax_fallback"][kind].get(task)
  if fb is not None:
    return fb, f"{fb['data']} (gold arcs; no parser for the task text)"
  return fig, "task sequences"


def claim_values(results: dict, c: paper.Claim, kind: str, rule: str = RULE) -> tuple[object, str]:
  """This run's value of claim ``c`` for ``kind`` (pretrained / finetuned) and what it was
  computed over; shares of heads by role ``rule`` (None when the run did not record it)."""
  tasks = results["tasks"]
  per = results["per_task"][kind]
  if rule != RULE:
    if c.summary_key not in ("share_delimiter", "share_unskilled", "share_syntactic_also_local"):
      return None, ""
    key = "summary"
    results = {**results, "per_task": {k: {t: {**f, key: f.get("calibrated")} for t, f in v.items()
                                           if f.get("calibrated")}
                                       for k, v in results["per_task"].items()},
               "syntax_fallback": {k: {t: {**f, key: f.get("calibrated")} for t, f in v.items()
                                       if f.get("calibrated")}
                                   for k, v in results["syntax_fallback"].items()}}
    per = results["per_task"][kind]
  if c.summary_key in ("mean_sieve_score", "auto_tau", "share_p_between"):
    pooled = results["pooled"][kind]
    return pooled[c.summary_key], f"pooled over {len([t for t in tasks if t in per])} task(s)"
  if c.summary_key in ("share_delimiter", "share_unskilled"):
    vals = {t: per[t]["summary"].get(c.summary_key) for t in tasks if t in per}
    note = "mean over " + ", ".join(f"{paper.TASK_NAMES[t]} {paper.format_value('share', v)}"
                                    for t, v in vals.items())
    if c.summary_key == "share_unskilled" and results.get("parser") == "none":
      note += " (no parser: the syntactic roles are not among the task roles)"
    return _mean(vals.values()), note
  if c.summary_key == "share_syntactic_also_local":
    vals, sources = {}, set()
    for t in tasks:
      fig, src = _syntactic(results, kind, t)
      if fig is not None:
        vals[t] = fig["summary"].get("share_syntactic_also_local")
        sources.add(src)
    finite = [v for v in vals.values() if v is not None]
    rng = (f"range {paper.format_value('share', min(finite))} to "
           f"{paper.format_value('share', max(finite))}; " if finite else "")
    return _mean(vals.values()), rng + "from " + "; ".join(sorted(sources))
  if c.summary_key == "spearman_local_syntactic":
    fig, src = _syntactic(results, kind, c.task)
    if fig is None:
      return None, "task not run"
    return fig["summary"].get("spearman_local_syntactic"), f"{paper.TASK_NAMES[c.task]}: {src}"
  if c.summary_key == "block_heads":
    fig = per.get(c.task)
    if fig is None:
      return None, "task not run"
    n = fig["num_block_heads"]
    return (0 if n is None else n), ("block not defined for single sentences" if n is None or
                                     c.task == "sst2" else "")
  if c.summary_key == "block_layer":
    total = None
    for t in tasks:
      if t in PAIR_TASKS and t in per and per[t]["block_by_layer"] is not None:
        b = np.asarray(per[t]["block_by_layer"])
        total = b if total is None else total + b
    if total is None or total.sum() == 0:
      return None, "no block heads"
    return int(np.argmax(total)), "block heads per layer: " + ", ".join(map(str, total.tolist()))
  if c.summary_key and c.summary_key.startswith("cluster_share:"):
    name = c.summary_key.split(":", 1)[1]
    vals = [per[t]["cluster_shares"][name] for t in tasks if t in per and per[t]["cluster_shares"]]
    return _mean(vals), f"mean over {len(vals)} task(s)"
  if c.summary_key == "cluster_stability":
    vals = [per[t]["cluster_stability"] for t in tasks if t in per]
    return _mean(vals), f"mean over {len(vals)} task(s)"
  return None, ""


def paper_table(results: dict) -> pd.DataFrame:
  """One row per claim: paper, claim, paper value, this run (pre-trained / fine-tuned),
  difference (for the claim's model), computed over, source, note."""
  rows = []
  for c in paper.CLAIMS:
    if c.task is not None and c.task not in results["tasks"]:
      continue
    pre, over_pre = claim_values(results, c, "pretrained")
    fin, over_fin = claim_values(results, c, "finetuned")
    cal, _ = claim_values(results, c, c.model, rule="calibrated")
    mine = pre if c.model == "pretrained" else fin
    rows.append({
        "key": c.key, "paper": c.paper.split(" (")[0], "claim": c.text,
        "paper_value": paper.format_paper_value(c),
        "this_run_pretrained": paper.format_value(c.kind, pre),
        "this_run_finetuned": paper.format_value(c.kind, fin),
        "difference": paper.format_difference(c, paper.difference(c, mine)),
        "this_run_calibrated_rule": paper.format_value(c.kind, cal) if cal is not None else "",
        "compared_model": c.model, "computed_over": over_pre if c.model == "pretrained" else over_fin,
        "source": c.source, "note": c.note,
        "value_paper": c.value, "value_pretrained": pre, "value_finetuned": fin})
  return pd.DataFrame(rows)


def finetune_table(results: dict) -> pd.DataFrame:
  """Per task: the best grid point (by the task's selection metric) and, at its best evaluation,
  the metric Devlin et al. report for BERT-base on dev, beside theirs."""
  rows = []
  for t in results["tasks"]:
    best = results["finetune"].get(t)
    if not best:
      continue
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
  """Per task and model: the headline figures."""
  keys = (("share_delimiter", "share"), ("share_local", "share"), ("share_syntactic", "share"),
          ("share_block", "share"), ("share_unskilled", "share"),
          ("share_syntactic_also_local", "share"), ("spearman_local_syntactic", "corr"),
          ("mean_sieve_score", "float"), ("share_p_between", "share"))
  rows = []
  for kind in ("pretrained", "finetuned"):
    for t in results["tasks"]:
      fig = results["per_task"][kind].get(t)
      if fig is None:
        continue
      row = {"task": paper.TASK_NAMES[t], "model": kind, "sequences": fig["summary"].get("num_sequences")}
      for k, fmt in keys:
        row[k] = paper.format_value(fmt, fig["summary"].get(k))
      rows.append(row)
  return pd.DataFrame(rows)


def overlap_table(results: dict) -> pd.DataFrame:
  rows = []
  for kind in ("pretrained", "finetuned"):
    for t in results["tasks"]:
      fig, src = _syntactic(results, kind, t)
      if fig is None:
        continue
      row = {"task": paper.TASK_NAMES[t], "model": kind, "data": src}
      for key, label in (("nsubj_next_local", "nsubj heads also next_local"),
                         ("obj_prev_local", "obj heads also prev_local")):
        o = fig["overlaps"].get(key)
        row[label] = ("not computed" if o is None else
                      f"{o['also']} of {o['heads']}" + (f" ({100 * o['share']:.0f}%)" if o["share"] is not None else ""))
      rows.append(row)
  return pd.DataFrame(rows)


def cluster_table(results: dict) -> pd.DataFrame:
  rows = []
  for kind in ("pretrained", "finetuned"):
    for t in results["tasks"]:
      fig = results["per_task"][kind].get(t)
      if fig is None or not fig["cluster_shares"]:
        continue
      row = {"task": paper.TASK_NAMES[t], "model": kind}
      row.update({n: paper.format_value("share", v) for n, v in fig["cluster_shares"].items()})
      row["stability"] = paper.format_value("share", fig["cluster_stability"])
      rows.append(row)
  return pd.DataFrame(rows)


def splits_table(results: dict) -> pd.DataFrame:
  rows = []
  for t in results["tasks"]:
    s = results["splits"].get(t)
    if not s:
      continue
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


def _figures(results: dict, fig_dir: Path) -> dict:
  """Draws the report's figures; returns ``{name: (path, title, caption)}``."""
  figs = {}
  tau = float((results.get("config") or {}).get("analysis", {}).get("tau", 3.0))
  alpha = float((results.get("config") or {}).get("analysis", {}).get("alpha", 0.05))
  pooled = results["pooled"]["pretrained"]
  n_tasks = len(results["per_task"]["pretrained"])
  if pooled["num_scores"]:
    figs["pooled_cdf"] = (pande_figures.plot_score_cdf(
        pooled["scores"], fig_dir / "pooled_score_cdf.png", tau=tau, mean=pooled["mean_sieve_score"],
        title=f"Fig. 3 (left): all sieve bias scores of the pre-trained model, {n_tasks} task(s) pooled"),
        "All sieve bias scores, pooled over the tasks (Pande et al. Fig. 3)",
        "Cumulative share of every sieve bias score (sequence x head x role) of the pre-trained "
        "model over the tasks' analysed sequences; the paper: mean 2.8, tau = 3.")
  if pooled["num_p_values"]:
    figs["pooled_p"] = (pande_figures.plot_pvalue_hist(
        pooled["p_values"], fig_dir / "pooled_pvalue_hist.png", alpha=alpha,
        title=f"Fig. 3 (right): p-values of all tests, {n_tasks} task(s) pooled"),
        "All p-values, pooled over the tasks (Pande et al. Fig. 3)",
        "p-values of every (task, layer, head, role) test of the pre-trained model; the paper: "
        "1.8% lie in (0.05, 0.95).")
  for t in results["tasks"]:
    name = paper.TASK_NAMES[t]
    for kind in ("pretrained", "finetuned"):
      fig = results["per_task"][kind].get(t)
      if fig is None:
        continue
      tests = rule_tests(contract.read_tests(fig["out"])[0])
      what = "pre-trained" if kind == "pretrained" else "fine-tuned"
      figs[f"venn_{t}_{kind}"] = (pande_figures.plot_role_venn(
          tests, fig_dir / f"venn_{t}_{kind}.png", title=f"{name}, {what}: role overlap"),
          f"{name}, {what}: overlap of the coarse roles (Fig. 4)", "")
      figs[f"grid_{t}_{kind}"] = (pande_figures.plot_role_grid(
          tests, fig_dir / f"grid_{t}_{kind}.png", title=f"{name}, {what}: roles per layer and head"),
          f"{name}, {what}: roles per layer and head (Fig. 5)", "")
    cmp_dir = Path(results["workdir"]) / "compare" / t
    if (cmp_dir / contract.COMPARE_JSON).is_file():
      comparison = contract.read_comparison(cmp_dir)
      figs[f"delta_{t}"] = (pande_figures.plot_finetune_delta(
          comparison.sieve_bias, fig_dir / f"delta_{t}.png",
          title=f"{name}: change of mean sieve bias after fine-tuning"),
          f"{name}: change of the mean sieve bias after fine-tuning (Fig. 6)",
          "Per role and layer group (initial, middle, final thirds of the layers): mean sieve "
          "bias of the fine-tuned model minus the pre-trained model's, on the same sequences.")
  first = next((results["per_task"]["pretrained"][t] for t in results["tasks"]
                if t in results["per_task"]["pretrained"]), None)
  if first is not None and first["cluster_shares"]:
    clusters, _ = contract.read_clusters(first["out"])
    figs["clusters"] = (guan_figures.plot_cluster_layers(
        clusters, fig_dir / "cluster_layers.png",
        title="Cluster type per layer, pre-trained model (first task's sequences)"),
        "Guan et al.: attention types per layer, pre-trained model", "")
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
            "none: the task text has no dependency arcs" + (f"; syntactic roles from {fb} (gold arcs)" if fb else "")),
           ("test", f"one-sided {(cfg.get('analysis') or {}).get('test', 't')}-test, tau = "
                    f"{(cfg.get('analysis') or {}).get('tau')}, alpha = {(cfg.get('analysis') or {}).get('alpha')}, "
                    f"correction {(cfg.get('analysis') or {}).get('correction')}")]
  paper_cols = ["paper", "claim", "paper_value", "this_run_pretrained", "this_run_finetuned",
                "difference", "compared_model", "computed_over", "this_run_calibrated_rule",
                "source", "note"]
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
      ("The papers' numbers beside this run",
       "<p>Every quantitative claim of Pande et al. (2021) and Guan et al. (2020) the "
       "reproduction checks. <i>difference</i> is this run minus the paper (shares in percentage "
       "points) for the model the claim is about (<i>compared_model</i>). Roles are assigned by "
       "the paper's rule (mean sieve bias significantly above tau); where the run also recorded "
       "the rule calibrated against uniform attention, its shares are in "
       "<i>this_run_calibrated_rule</i>.</p>"
       + page.table_html(table[paper_cols], table_id="table-paper")),
      ("Fine-tuning: best dev score per task",
       "<p>The best evaluation of each grid point is kept; the table gives the best grid point per "
       "task beside Devlin et al.'s BERT-base dev score (their Table 5; QQP dev is not reported "
       "there). The evaluation rows are the ones in the Splits table, which for some presets are "
       "not GLUE's dev set.</p>" + page.table_html(finetune_table(results), table_id="table-finetune")),
      ("Fig. 3: all scores and p-values, pooled over the tasks", _fig(figs, "pooled_cdf") + _fig(figs, "pooled_p")),
      ("Headline figures per task", page.table_html(task_table(results), table_id="table-tasks")),
      ("Fine-role overlaps: nsubj with next_local, obj with prev_local",
       "<p>A dependent usually precedes its head in a subject relation and follows it in an "
       "object relation, so the paper finds nsubj heads that also attend to the next tokens and "
       "obj heads that also attend to the previous ones.</p>"
       + page.table_html(overlap_table(results), table_id="table-overlaps")),
  ]
  for t in results["tasks"]:
    name = paper.TASK_NAMES[t]
    links = [_link(workdir, Path(results["per_task"][k][t]["out"]) / "report.html", f"{k} analysis report")
             for k in ("pretrained", "finetuned") if t in results["per_task"][k]]
    links.append(_link(workdir, workdir / "compare" / t / "report.html", "comparison report"))
    links = [x for x in links if x]
    body = (f"<p>{' | '.join(links)}</p>" if links else "")
    body += "".join(_fig(figs, f"{p}_{t}_{k}") for p in ("venn", "grid") for k in ("pretrained", "finetuned"))
    body += _fig(figs, f"delta_{t}")
    sections.append((f"{name}: Figs. 4-6", body))
  sections.append(("Guan et al.: attention types (clusters) and their stability",
                   "<p>Share of heads per cluster type (K-means, k = 4, on the 21 distance "
                   "features) and the stability of the clustering (fraction of heads whose cluster "
                   "is the same in all 10 fits on random halves of the heads).</p>"
                   + page.table_html(cluster_table(results), table_id="table-clusters")
                   + _fig(figs, "clusters")))
  report = page.write_page(workdir, title="Reproduction of Pande et al. (AAAI 2021)",
                           subtitle=f"heads-jax reproduce, preset {cfg.get('preset')}: "
                                    f"{', '.join(paper.TASK_NAMES[t] for t in results['tasks'])}",
                           sections=sections)
  out = {k: v for k, v in results.items() if k not in ("pooled", "per_task", "syntax_fallback")}
  out["pooled"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("scores", "p_values")}
                   for k, v in results["pooled"].items()}
  out["per_task"] = {k: {t: {kk: vv for kk, vv in f.items()} for t, f in v.items()}
                     for k, v in results["per_task"].items()}
  out["paper_table"] = table.drop(columns=["value_paper"]).to_dict(orient="records")
  out["finetune_table"] = finetune_table(results).to_dict(orient="records")
  contract.write_json(out, workdir / "results.json")
  return {"report": str(report), "paper_table": str(workdir / "paper_table.csv"),
          "results": str(workdir / "results.json")}
