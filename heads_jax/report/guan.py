"""The report of the guan pipeline (``heads-jax reproduce --config configs/reproduce.py:guan``):
Guan et al. 2020 judged in their own setting (no jax).

Inputs: the analysis directories of the models (``{label: dir}``, labels ``squad`` (the SQuAD
model, always), ``pretrained``, ``mrpc``, ``mnli``), the Tables 2-3 rows of the SQuAD model's
ablation (``paper_tables.csv`` of `heads_jax.ablation.guan.paper_tables`: EM / F1 as fractions,
converted here to percent, the paper's unit) with the number of questions evaluated, and the
SQuAD model's name.

* `guan_run_figures`: the run as `heads_jax.hoststats.claims.evaluate` reads it. The setting is
  "guan" when the SQuAD model is Guan et al.'s by name (`GUAN_MODEL`: "We use
  bert-large-uncased-whole-word-masking-finetuned-squad", footnote 1) and by shape (its
  analysis has 24 layers x 16 heads, `paper.GUAN_SHAPE`: a local copy under that name with
  another shape is not theirs), else "guan_other" (their statements judged, their numbers "not
  comparable"). The pre-trained model was analysed on the SQuAD samples, so Fig. 4's claims
  (changes after fine-tuning) set it against the SQuAD model only; the MRPC and MNLI models,
  analysed on their own data, are not set against it (`claims.run.change_pairs`).
* `claims_table`: one row per claim of Guan et al. with this run's value and the verdict.
* `table1`: Table 1 (stability per model) beside the paper's.
* `naming_table`: per model and type, the centroid's near / far / special mass, the name's margin
  and flag, and the outlier heads (`heads_jax.hoststats.clustering`).
* `write_guan_report`: ``report.html`` (the claims judged, Table 1, the names and their check,
  Figs. 1-4 of the SQuAD model and Fig. 4 of every model, Tables 2-3), ``guan_claims.csv``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from heads_jax import contract
from heads_jax.hoststats import claims as paper
from heads_jax.report import page
from heads_jax.report.figures import guan as guan_figures
from heads_jax.report.reproduce import analysis_of

GUAN_MODEL = "bert-large-uncased-whole-word-masking-finetuned-squad"
MODEL_LABELS = ("squad", "pretrained", "mrpc", "mnli")     # Table 1's columns, SQuAD first
PAPER_LABELS = {"pretrained": "Pre-train", "squad": "SQuAD", "mrpc": "MRPC", "mnli": "MNLI"}
CLAIMS_CSV = "guan_claims.csv"


def is_guans_model(model: str) -> bool:
  """Whether ``model`` (a hub id or a path) names Guan et al.'s SQuAD model."""
  return str(model).rstrip("/").split("/")[-1] == GUAN_MODEL


def squad_rows(tables: pd.DataFrame | None) -> dict:
  """``{id: {"exact_match", "f1", "missing"}}`` from a ``paper_tables.csv`` table: EM and F1 in
  percent (the table's fractions), ``missing`` the types the row needs that the clustering left
  without heads (unnamed: its definition not met; "" when none)."""
  if tables is None or not len(tables):
    return {}
  em = "exact_match" if "exact_match" in tables.columns else "accuracy"

  def missing(r):
    v = r.get("missing_types", "")
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()

  return {int(r["id"]): {"exact_match": 100.0 * float(r[em]), "f1": 100.0 * float(r["f1"]),
                         "missing": missing(r)}
          for _, r in tables.iterrows()}


def guan_run_figures(analyses: dict, *, squad_model: str, tables: pd.DataFrame | None = None,
                     questions: int | None = None) -> paper.RunFigures:
  """The guan pipeline's run as the claims read it.

  Args:
    analyses: ``{label: analysis directory}`` (labels of `MODEL_LABELS`; ``squad`` required).
    squad_model: the SQuAD model's hub id or path (decides the setting).
    tables: the ablation's ``paper_tables.csv`` rows, or None.
    questions: the number of questions the ablation evaluated (the EM's interval).
  """
  if "squad" not in analyses:
    raise ValueError("the guan pipeline's analyses need the SQuAD model's ('squad')")
  finetuned = {label: analysis_of(d) for label, d in analyses.items() if label != "pretrained"}
  pretrained = ({"squad": analysis_of(analyses["pretrained"])} if "pretrained" in analyses
                else {})
  rows = squad_rows(tables)
  shape = tuple(int(x) for x in finetuned["squad"].assigned.shape[:2])
  return paper.RunFigures(
      tasks=tuple(dict.fromkeys(list(finetuned) + list(pretrained))),
      analyses={"finetuned": finetuned, "pretrained": pretrained},
      setting="guan" if is_guans_model(squad_model) and shape == paper.GUAN_SHAPE else "guan_other",
      squad={"rows": rows, "n": questions} if rows else None, model=str(squad_model))


def _shown(c: paper.Claim, value) -> str:
  if value is None:
    return ""
  if isinstance(value, str) or c.kind == "text":
    return str(value)
  return paper.format_value(c.kind, value)


def _rounded(x, digits: int = 6):
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return None
  return round(float(x), digits) if math.isfinite(float(x)) else None


def claims_table(run: paper.RunFigures) -> pd.DataFrame:
  """One row per claim of Guan et al. judged on ``run`` (columns as reproduce's paper table)."""
  rows = []
  for c, e in paper.evaluate_all(run, paper.claims(paper.GUAN)):
    rows.append({
        "key": c.key, "claim": c.text, "paper_value": paper.format_paper_value(c),
        "this_run": _shown(c, e.value), "verdict": e.verdict,
        "difference": paper.format_difference(c, paper.difference(c, e.value)),
        "detail": e.detail, "source": c.source, "quote": c.quote, "rule": c.rule,
        "measure": c.measure, "note": c.note,
        "value_paper": _rounded(c.value), "value_this_run": _rounded(e.value)})
  return pd.DataFrame(rows)


def table1(analyses: dict) -> pd.DataFrame:
  """Table 1: the stability of each model's clustering (percent), this run's beside the
  paper's; ``analyses``: ``{label: {"stability": fraction or None}}``."""
  paper_values = {c.key.replace("guan_stability_", ""): c.value for c in paper.CLAIMS
                  if c.key.startswith("guan_stability_") and c.value is not None}
  rows = []
  for label in MODEL_LABELS:
    mine = (analyses.get(label) or {}).get("stability")
    rows.append({"model": PAPER_LABELS[label],
                 "this run": None if mine is None else round(100 * float(mine), 2),
                 "paper": round(100 * paper_values[PAPER_LABELS[label].lower().replace("-", "")], 2),
                 "analysed": label in analyses})
  return pd.DataFrame(rows)


def naming_table(analyses: dict) -> pd.DataFrame:
  """Per model and cluster: heads, the members' near / far / special mass, the name's margin (in
  units of the clusters' spread, by which Guan et al.'s definition of the type holds; not
  positive: not met, and the cluster is "unnamed (closest: X, margin m)") and its check, and
  the outlier heads that joined it."""
  rows = []
  for label in MODEL_LABELS:
    if label not in analyses:
      continue
    _, info = contract.read_clusters(analyses[label])
    columns = info.get("naming_columns") or []
    outliers = info.get("outliers") or []
    for name, size, row in zip(info.get("names") or [], info.get("sizes") or [],
                               info.get("naming") or []):
      r = dict(zip(columns, row))
      rows.append({"model": PAPER_LABELS[label], "type": name, "heads": size,
                   "near": r.get("near"), "far": r.get("far"), "special": r.get("special"),
                   "margin": r.get("margin"), "check": r.get("check", ""),
                   "outlier heads joined": ", ".join(f"{o['layer']}:{o['head']}" for o in outliers
                                                     if o.get("cluster_name") == name)})
  return pd.DataFrame(rows)


def write_guan_report(workdir, *, analyses: dict, squad_model: str,
                      tables: pd.DataFrame | None = None, questions: int | None = None,
                      models: dict | None = None, settings: dict | None = None,
                      tables_section: dict | None = None) -> dict:
  """Writes ``workdir/report.html`` and ``workdir/guan_claims.csv``.

  Args:
    analyses: ``{label: analysis directory}``.
    squad_model: the SQuAD model (hub id or path).
    tables, questions: the ablation's Tables 2-3 rows and the number of questions evaluated.
    models: ``{label: (model, data)}`` for the analyses' links (optional).
    settings: the run's settings table (optional).
    tables_section: the Tables 2-3 section (``report.ablation.paper_tables_section``), if any.

  Returns ``{"report", "claims", "table1", "verdicts"}``.
  """
  workdir = Path(workdir)
  run = guan_run_figures(analyses, squad_model=squad_model, tables=tables, questions=questions)
  claims = claims_table(run)
  claims.to_csv(workdir / CLAIMS_CSV, index=False)
  stability = {k: {"stability": contract.read_clusters(d)[1].get("stability")}
               for k, d in analyses.items()}
  t1 = table1(stability)
  counts = {v: int((claims["verdict"] == v).sum()) for v in paper.VERDICTS}
  fig_dir = workdir / "figures"
  models = models or {}

  def rel(d):
    d = Path(d)
    return d.relative_to(workdir).as_posix() if d.is_relative_to(workdir) else d.as_posix()

  links = "".join(
      f'<li>{page.esc(PAPER_LABELS[k])}: <a href="{page.esc(rel(d))}/{contract.REPORT_HTML}">'
      f"analysis report</a>" + (f" ({page.esc(models[k][0])} on {page.esc(models[k][1])})"
                                if k in models else "") + "</li>"
      for k, d in analyses.items())
  setting_text = ("Guan et al.'s own model: every claim is judged" if run.setting == "guan" else
                  f"another SQuAD model than Guan et al.'s ({page.esc(squad_model)}): their "
                  "statements are judged, their numbers are not comparable (value shown)")
  squad_df, squad_info = contract.read_clusters(analyses["squad"])
  figs = [
      (guan_figures.plot_type_masses(squad_df, fig_dir / "types_masses.png", info=squad_info),
       "The names and their check: near, far and special mass per type (SQuAD model)",
       "Each type is named by Guan et al.'s definition (section 4), between the types and "
       "against uniform attention at the data's lengths: dense the highest far mass and little "
       "special, diagonal the highest near mass and medium special, dense+vertical far and "
       "special both large, vertical the highest special; the margin is in units of the "
       "clusters' spread (not positive: not met, and the cluster is unnamed)."),
      (guan_figures.plot_cluster_features(squad_df, fig_dir / "fig1_features.png"),
       "Fig. 1: distance features per type (SQuAD model)", ""),
      (guan_figures.plot_cluster_layers(squad_df, fig_dir / "fig3_layers.png"),
       "Fig. 3: types per layer (SQuAD model)", ""),
  ]
  if squad_df[["tsne_x", "tsne_y"]].notna().all().all():
    figs.insert(2, (guan_figures.plot_cluster_tsne(squad_df, fig_dir / "fig2_tsne.png"),
                    "Fig. 2: t-SNE of the heads (SQuAD model)", ""))
  fig4 = ""
  for label in MODEL_LABELS:
    if label in analyses:
      df, _ = contract.read_clusters(analyses[label])
      path = guan_figures.plot_cluster_layers(df, fig_dir / f"fig4_{label}.png",
                                              title=f"{PAPER_LABELS[label]} model")
      fig4 += page.figure_html(path, f"Fig. 4 ({PAPER_LABELS[label]})",
                               "Attention types per layer (Guan et al. Fig. 4: \"all the four "
                               "models share similar head type distribution\").")
  sections = [
      {"title": "Analyses", "html": f"<ul>{links}</ul>"},
      {"title": "Guan et al.'s claims judged in their setting",
       "html": (f"<p>This run: {setting_text}. {counts[paper.HOLDS]} hold, "
                f"{counts[paper.FAILS]} do not hold, {counts[paper.NOT_COMPUTABLE]} are not "
                f"computable here (a type whose definition is not met among them), "
                f"{counts[paper.NOT_COMPARABLE]} not comparable. Shares and "
                "EM are judged by the 95% Wilson interval of this run's value over its heads or "
                "questions (DESIGN.md section 3, \"Verdicts\"); EM and F1 in percent, as the "
                f"paper; every rule and quoted sentence in {CLAIMS_CSV}.</p>"
                + page.table_html(claims[["claim", "paper_value", "this_run", "verdict",
                                          "difference", "detail"]],
                                  table_id="table-guan-claims"))},
      {"title": "Table 1: stability of the clustering",
       "html": ("<p>Share of heads (percent) two fits on random halves label alike, averaged "
                "over all pairs of the 10 fits (Von Luxburg 2010, as Guan et al.), per model; "
                "the paper's values are BERT-large's. Models this run did not analyse are "
                "blank.</p>"
                + page.table_html(t1, table_id="table-guan-table1", float_format="{:.2f}"))},
      {"title": "The types and how they were named",
       "html": ("<p>Per model, each cluster's near / far / special attention mass, the margin of "
                "its name in units of the clusters' spread (not positive: the definition is "
                "not met and the cluster is unnamed; flagged below 1) and the outlier heads "
                "(heads beyond Tukey's far-out fence of the distances to their centroids, and "
                "clusters under 5% of the heads, are set aside and K-means refit; they join "
                "their nearest cluster).</p>"
                + page.table_html(naming_table(analyses), table_id="table-guan-naming")
                + "".join(page.figure_html(p, t, c) for p, t, c in figs))},
      {"title": "Fig. 4: attention types per layer, per model", "html": fig4},
  ]
  if tables_section:
    sections.append(tables_section)
  report = page.write_page(workdir, title="Guan et al. 2020: how far does BERT look at",
                           sections=sections, settings=settings,
                           subtitle=f"{paper.GUAN}; this run: {squad_model}")
  return {"report": str(report), "claims": str(workdir / CLAIMS_CSV),
          "table1": t1.to_dict(orient="records"), "verdicts": counts}
