"""The figure registry (heads_jax.report.spec): every registered figure draws on a small fixture
and appears in its report; a new spec registered once reaches its report; names are unique."""

import numpy as np
import pandas as pd
import pytest

from heads_jax.report import ablation, analysis, compare, measures, page, spec
from heads_jax.report.figures import pande
from tests.report.test_report import (DPI, SETTINGS, SUMMARY, check_png, make_clusters_df,
                                      make_compare, make_scores, make_tests_df)


def _anchor(name):
  return f'id="fig-{page.slug(name)}"'


@pytest.fixture(scope="module")
def fixture():
  scores = make_scores(n=4, layers=2, heads=3)
  compare_df, heads_df, changes = make_compare(layers=2, heads=3)
  rng = np.random.default_rng(0)
  L, H = 2, 3
  measures_npz = {"entropy": rng.uniform(0.5, 2.5, (4, L, H)),
                  "cls_entropy": rng.uniform(0.5, 2.5, (4, L, H)),
                  "token_attention": rng.dirichlet(np.ones(5), (4, L, H)),
                  "lengths": np.array([8, 9, 10, 11]),
                  "js": (lambda a: (a + a.T) / 2 * (1 - np.eye(L * H)))(rng.uniform(0.1, 0.6, (L * H,) * 2)),
                  # a DeBERTa analysis' term shares (c2c, c2p, p2c)
                  "term_shares": rng.dirichlet(np.ones(3), (4, L, H)),
                  "term_names": ("c2c", "c2p", "p2c")}
  groups = pd.DataFrame({"group": ["none", "dense", "vertical"],
                         "kind": ["baseline", "cluster", "cluster"], "num_heads": [0, 2, 1],
                         "ablation": ["none", "remove", "remove"], "accuracy": [0.9, 0.8, 0.85],
                         "accuracy_change": [0.0, -0.1, -0.05],
                         "random_accuracy_change": [np.nan, -0.02, -0.01],
                         "random_accuracy_std": [np.nan, 0.01, 0.01]})
  segments = pd.DataFrame({"group": ["none", "dense", "dense"], "kind": ["baseline", "cluster", "cluster"],
                           "num_heads": [0, 2, 2], "ablation": ["none", "intra", "inter"],
                           "accuracy_change": [0.0, -0.1, -0.02]})
  pruning = pd.DataFrame({"method": ["importance"] * 3 + ["random"] * 6,
                          "seed": [0] * 3 + [0, 0, 0, 1, 1, 1],
                          "share_pruned": [0.0, 0.5, 1.0] * 3,
                          "accuracy": [0.9, 0.85, 0.5, 0.9, 0.7, 0.5, 0.9, 0.75, 0.5]})
  heads = pd.DataFrame({"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                        "value": rng.uniform(0, 1, L * H), "low": 0.0, "high": 1.0,
                        "rank": np.arange(1, L * H + 1)})
  patching = heads.assign(estimated_value=rng.uniform(0, 1, L * H), estimated_low=0.0,
                          estimated_high=1.0, estimated_rank=np.arange(1, L * H + 1))
  head_pruning = pruning.assign(method=["attribution"] * 3 + ["random"] * 6,
                                accuracy_low=pruning["accuracy"] - 0.05,
                                accuracy_high=pruning["accuracy"] + 0.05)
  roles = np.array([["local", "", "delimiter"], ["", "delimiter,local", ""]], dtype=object)
  return dict(scores=scores, tests=make_tests_df(scores["sieve_bias"], scores["roles"]),
              attribution=heads, patching=patching, head_pruning=head_pruning, roles=roles,
              clusters=make_clusters_df(layers=L, heads=H), compare=compare_df, heads=heads_df,
              changes=changes, measures=measures_npz, groups=groups, segments=segments,
              pruning=pruning, importance=rng.uniform(0, 1, (L, H)),
              similarity=rng.uniform(0.5, 1, (L, H)))


def test_names_are_unique_and_every_spec_is_complete():
  figs = spec.all_figures()
  assert len(figs) >= 19
  for f in figs.values():
    assert f.title and f.caption and f.how and f.paper and callable(f.draw), f.name
    assert set(f.reports) <= set(spec.REPORTS)
  with pytest.raises(ValueError, match="already registered"):
    pande.FIGURES.register("score_cdf", title="t", caption="c", how="h", draw=None,
                           reports=("analysis",))
  with pytest.raises(ValueError, match="reports must be"):
    spec.Figure("x", "t", "c", "h", draw=None, reports=("nowhere",))


@pytest.mark.slow
def test_every_registered_figure_draws_and_appears_in_its_report(fixture, tmp_path):
  f = fixture
  shown = set()
  # analysis
  drawn = analysis.analysis_figures(
      tmp_path / "a" / "figures", sieve_bias=f["scores"]["sieve_bias"], roles=f["scores"]["roles"],
      tests_df=f["tests"], tau=3.0, alpha=0.05, clusters_df=f["clusters"], dpi=DPI, rule="paper")
  # Figures with optional inputs: Guan Fig. 5 needs examples.json, the second pass's figures its
  # tables (report/robustness.py draws them); without those inputs they are left out, not empty.
  optional = {"all_maps"} | {g.name for g in spec.figures_for("analysis")
                             if g.name.startswith("robustness_")}
  assert optional <= {g.name for g in spec.figures_for("analysis")}
  assert set(drawn) == {g.name for g in spec.figures_for("analysis")} - optional
  for name in sorted(optional):
    assert spec.figure(name).draw(spec.Inputs(), tmp_path / f"{name}.png", title="t", dpi=DPI) is None
  text = analysis.write_report(tmp_path / "a", title="t", settings=SETTINGS, summary=SUMMARY,
                               tests_df=f["tests"], figures=drawn).read_text()
  shown |= {n for n in drawn if _anchor(n) in text and page.esc(spec.figure(n).caption) in text}
  # compare (+ the similarity section)
  text = compare.write_compare_report(tmp_path / "c", compare_df=f["compare"],
                                      cluster_changes_df=f["changes"], dpi=DPI,
                                      extra_sections=[compare.similarity_section(
                                          f["similarity"], fig_dir=tmp_path / "c" / "figures",
                                          dpi=DPI)]).read_text()
  shown |= {g.name for g in spec.figures_for("compare") if page.esc(g.caption) in text}
  assert (tmp_path / "c" / "figures" / "attention_similarity.png").is_file()
  # measures: one section per figure, headed by the spec's section
  secs = measures.measures_sections(f["measures"], tmp_path / "m", dpi=DPI)
  assert [s["title"] for s in secs] == [g.section for g in spec.figures_for("measures")]
  for s in secs:  # each section opens with its registered paragraph
    intro = spec.section("measures", s["title"]).intro
    assert intro.startswith("<p>") and s["html"].startswith(intro)
  html = "".join(s["html"] for s in secs)
  shown |= {g.name for g in spec.figures_for("measures") if _anchor(g.name) in html}
  # ablation: drawn from the tables through the registry, text from the specs
  inputs = spec.Inputs(group_table=f["groups"], segment_table=f["segments"],
                       importance=f["importance"], pruning_curve=f["pruning"], metric="accuracy",
                       attribution=f["attribution"], patching=f["patching"], roles=f["roles"],
                       head_pruning=f["head_pruning"])
  paths = spec.draw("ablation", inputs, tmp_path / "ab", dpi=DPI)
  causal = {"robustness_causal"}  # drawn from causal.csv (report/robustness.py) when ablate --by role wrote it
  assert set(paths) == {g.name for g in spec.figures_for("ablation")} - causal
  assert spec.figure("robustness_causal").draw(spec.Inputs(), tmp_path / "c.png", title="t", dpi=DPI) is None
  html = (ablation.ablation_section(f["groups"], paths["group_ablation"])["html"]
          + ablation.segment_section(f["segments"], paths["segment_ablation"])["html"]
          + ablation.importance_section(f["importance"], paths["importance"])["html"]
          + ablation.pruning_section(f["pruning"], f["pruning"], paths["pruning"])["html"]
          + ablation.carriers_section(ablation.AblationResults(
              base={}, metrics=("accuracy",), attribution=f["attribution"], patching=f["patching"],
              roles=f["roles"], head_pruning=f["head_pruning"]), tmp_path / "ab2", dpi=DPI)["html"])
  shown |= {g.name for g in spec.figures_for("ablation") if g.name not in causal
            and page.esc(g.caption.format(metric="accuracy")) in html and page.esc(g.how) in html}
  for p in list(drawn.values()) + list(paths.values()):
    check_png(p, min_bytes=500)
  assert shown == set(spec.all_figures()) - optional - causal, set(spec.all_figures()) - shown


def test_a_new_spec_registered_once_reaches_the_report(fixture, tmp_path):
  f = fixture
  calls = []

  def draw(inputs, path, *, title, dpi):
    calls.append((inputs.tau, title))
    return pande.plot_score_cdf(inputs.sieve_bias, path, tau=inputs.tau, title=title, dpi=dpi)

  pande.FIGURES.register("fake_cdf", title="A fake figure", caption="Fake <caption>.",
                         how="Read it fakely.", draw=draw, reports=("analysis",),
                         reproduces="Fig. 99", rule_in_title=True)
  # a figure in a section of its own: the section (with its paragraph) follows the role tables
  pande.FIGURES.section("analysis", "Fake section", "<p>Fake intro.</p>")
  pande.FIGURES.register("fake_other", title="Other fake", caption="Other caption.", how="h",
                         draw=draw, reports=("analysis",), section="Fake section")
  try:
    drawn = analysis.analysis_figures(
        tmp_path / "figures", sieve_bias=f["scores"]["sieve_bias"], roles=f["scores"]["roles"],
        tests_df=f["tests"], tau=3.0, dpi=DPI, rule="calibrated")
    assert drawn["fake_cdf"] == tmp_path / "figures" / "fake_cdf.png"
    assert calls == [(3.0, "A fake figure (calibrated rule)"), (3.0, "Other fake")]
    text = analysis.write_report(tmp_path, title="t", settings=SETTINGS, summary=SUMMARY,
                                 tests_df=f["tests"], figures=drawn).read_text()
    assert _anchor("fake_cdf") in text and "Fake &lt;caption&gt;." in text
    assert "Read it fakely." in text
    fake = text[text.index('<section id="fake-section">'):]
    assert fake.startswith('<section id="fake-section"><h2>Fake section</h2><p>Fake intro.</p>')
    assert _anchor("fake_other") in fake[:fake.index("</section>")]
    assert text.index("Assigned roles per head") < text.index('<section id="fake-section">')
    assert "fake_cdf" not in {g.name for g in spec.figures_for("compare")}
  finally:
    pande.FIGURES.unregister("fake_cdf")
    pande.FIGURES.unregister("fake_other")
    pande.FIGURES.unregister_section("analysis", "Fake section")
  assert "fake_cdf" not in spec.all_figures()


def test_importance_figure_takes_its_colour_bar_label_from_the_inputs(tmp_path, monkeypatch):
  from heads_jax.report.figures import michel
  seen = {}
  monkeypatch.setattr(michel, "plot_importance", lambda imp, path, **k: seen.update(k) or path)
  draw = michel._draw_importance
  draw(spec.Inputs(importance=np.ones((2, 4)), importance_label="E|dL/dgate|"), tmp_path / "a.png", title="", dpi=50)
  assert seen["label"] == "E|dL/dgate|"
  draw(spec.Inputs(importance=np.ones((2, 4))), tmp_path / "b.png", title="", dpi=50)
  assert seen["label"] == "importance"


def test_a_figure_without_an_input_it_needs_is_left_out_before_its_draw_runs(tmp_path):
  calls = []
  fig = spec.Figure(name="f", title="t", caption="c", how="h", reports=("analysis",),
                    draw=lambda i, path, **kw: calls.append(i.table) or path, needs=("table",))
  assert fig.draw(spec.Inputs(), tmp_path / "f.png", title="t", dpi=50) is None
  assert fig.draw(spec.Inputs(table=None, other=1), tmp_path / "f.png", title="t", dpi=50) is None
  assert calls == []
  assert fig.draw(spec.Inputs(table=[]), tmp_path / "f.png", title="t", dpi=50) == tmp_path / "f.png"
  assert calls == [[]]
