"""Tests of the report stage: figures (PNG), HTML reports, the analysis-directory builder and the
optional headless-Chromium screenshot. Synthetic inputs with the contract's columns; no jax."""

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from heads_jax.data import vocabulary
from heads_jax.hoststats import roles as roles_lib
from heads_jax.report import analysis, compare, headline, page, spec, style, tables
from heads_jax.report.figures import guan, pande

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------
# synthetic contract data


def make_scores(n=6, layers=3, heads=4, roles=vocabulary.ROLES, seed=0):
  """sieve_bias [n, l, h, r] (lognormal, some NaN), distance [n, l, h, 21] (rows sum to 1)."""
  rng = np.random.default_rng(seed)
  scale = rng.lognormal(0.6, 0.9, size=(1, layers, heads, len(roles)))
  bias = (scale * rng.lognormal(0, 0.3, size=(n, layers, heads, len(roles)))).astype(np.float32)
  bias[rng.random(bias.shape) < 0.05] = np.nan
  distance = rng.dirichlet(np.ones(21), size=(n, layers, heads)).astype(np.float32)
  return {"sieve_bias": bias, "roles": np.array(roles), "distance": distance,
          "lengths": rng.integers(5, 20, size=n)}


def make_tests_df(sieve_bias, roles, tau=3.0, alpha=0.05):
  """tests.csv rows from scores with scipy's one-sided t-test (independent of hoststats)."""
  rows = []
  _, layers, heads, _ = sieve_bias.shape
  for l in range(layers):
    for h in range(heads):
      for r, role in enumerate(roles):
        v = sieve_bias[:, l, h, r]
        v = v[np.isfinite(v)]
        t = stats.ttest_1samp(v, tau, alternative="greater")
        rows.append({"layer": l, "head": h, "role": str(role), "mean": float(v.mean()),
                     "n": len(v), "statistic": float(t.statistic), "p_value": float(t.pvalue),
                     "p_adjusted": float(t.pvalue), "assigned": bool(t.pvalue < alpha)})
  return pd.DataFrame(rows)


def make_clusters_df(layers=3, heads=4, seed=0):
  rng = np.random.default_rng(seed)
  names = ["dense", "diagonal", "dense+vertical", "vertical"]
  rows = []
  for l in range(layers):
    for h in range(heads):
      c = (l + h) % 4
      feats = rng.dirichlet(np.ones(21) + 5 * np.eye(21)[[8, 16, 17, 0][c]])
      row = {"layer": l, "head": h}
      row.update(dict(zip(vocabulary.DISTANCE_FEATURES, feats)))
      row.update({"cluster": c, "cluster_name": names[c], "tsne_x": c * 5 + rng.normal(),
                  "tsne_y": (c % 2) * 5 + rng.normal()})
      rows.append(row)
  return pd.DataFrame(rows)


def make_compare(layers=3, heads=4, roles=("local", "cls", "sep", "nsubj", "block")):
  rows = []
  for i, role in enumerate(roles):
    for j, group in enumerate(roles_lib.LAYER_GROUPS):
      before = 2.0 + i + 0.1 * j
      after = before + (-1) ** (i + j) * 0.3 * (j + 1)
      rows.append({"role": role, "layer_group": group, "before": before, "after": after,
                   "delta": after - before})
  compare = pd.DataFrame(rows)
  heads_rows, change_rows = [], []
  for l in range(layers):
    for h in range(heads):
      gained = "cls;sep" if (l, h) == (0, 1) else ""
      lost = "nsubj" if (l, h) == (1, 2) else ""
      heads_rows.append({"layer": l, "head": h, "roles_before": "local;nsubj",
                         "roles_after": "local", "gained": gained, "lost": lost})
      after = "vertical" if (l + h) % 5 == 0 else "dense"
      change_rows.append({"layer": l, "head": h, "cluster_before": "dense",
                          "cluster_after": after, "changed": after != "dense"})
  return compare, pd.DataFrame(heads_rows), pd.DataFrame(change_rows)


SETTINGS = {"tau": 3.0, "tau_requested": "3", "alpha": 0.05, "test": "t", "correction": "none",
            "direction": "dependent->head", "model": "tiny <script>alert(1)</script>",
            "data": "ud_ewt test", "max_length": 128, "num_sequences": 6}

SUMMARY = {"share_local": 0.25, "share_syntactic": 0.5, "share_delimiter": 0.75,
           "share_block": 0.0, "share_unskilled": 0.125, "share_syntactic_also_local": 1 / 3,
           "spearman_local_syntactic": 0.4123, "spearman_p_value": 1.2e-5,
           "mean_sieve_score": 2.7512, "share_p_between": 0.025, "custom <key>": [1, 2]}


def check_png(path, min_bytes=2000):
  path = Path(path)
  data = path.read_bytes()
  assert data.startswith(PNG_SIGNATURE), f"{path} is not a PNG"
  assert len(data) > min_bytes, f"{path} is suspiciously small ({len(data)} bytes)"
  import matplotlib.image as mpimg
  img = mpimg.imread(path)
  assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
  assert img[..., :3].std() > 0.01, f"{path} looks blank"
  return img


DPI = 60  # small PNGs keep the tests fast; the drawing code is the same at any dpi


@pytest.fixture(scope="module")
def data():
  scores = make_scores()
  tests_df = make_tests_df(scores["sieve_bias"], scores["roles"])
  clusters = make_clusters_df()
  compare, heads_df, changes = make_compare()
  return dict(scores=scores, tests=tests_df, clusters=clusters, compare=compare,
              heads=heads_df, changes=changes)


@pytest.fixture(scope="module")
def drawn(data, tmp_path_factory):
  """All analysis figures, drawn once for the module: {name: png path}."""
  return analysis.analysis_figures(
      tmp_path_factory.mktemp("figures"), sieve_bias=data["scores"]["sieve_bias"],
      roles=data["scores"]["roles"], tests_df=data["tests"], tau=3.0, alpha=0.05,
      clusters_df=data["clusters"], dpi=DPI)


# ------------------------------------------------------------------------------------------------
# data shaping (hand-derived expectations)


def small_tests():
  """Two layers x two heads; hand-chosen assignments."""
  assigned = {(0, 0): {"cls", "prev_local"}, (0, 1): set(),
              (1, 0): {"nsubj", "local", "sep", "block"}, (1, 1): {"nsubj"}}
  rows = []
  for (l, h), roles in assigned.items():
    for role in ("local", "prev_local", "cls", "sep", "nsubj", "block"):
      rows.append({"layer": l, "head": h, "role": role, "mean": 1.0 + l + h / 10,
                   "assigned": "True" if role in roles else "False"})
  return pd.DataFrame(rows)


def test_coarse_role_flags_by_hand():
  # coarse roles are the paper's four tests (issue 23): cls, prev_local or nsubj alone make none
  flags = tables.coarse_role_flags(small_tests()).set_index(["layer", "head"])
  assert flags.loc[(0, 0)].to_dict() == {"local": False, "syntactic": False, "delimiter": False,
                                         "block": False, "unskilled": True}
  assert flags.loc[(0, 1), "unskilled"]
  assert flags.loc[(1, 0)].to_dict() == {"local": True, "syntactic": False, "delimiter": False,
                                         "block": True, "unskilled": False}
  assert flags.loc[(1, 1), "unskilled"]


def test_roles_per_layer_and_head_by_hand():
  per_layer = tables.roles_per_layer(small_tests())
  assert per_layer.loc[0, "cls"] == 1 and per_layer.loc[1, "nsubj"] == 2
  assert per_layer.loc[1, "any syntactic"] == 0 and per_layer.loc[0, "unskilled"] == 2
  assert per_layer.loc["all", "heads"] == 4 and per_layer.loc["all", "any local"] == 1
  assert list(per_layer.columns[:6]) == ["local", "prev_local", "block", "cls", "sep", "nsubj"]
  per_head = tables.roles_per_head(small_tests()).set_index(["layer", "head"])
  assert per_head.loc[(1, 0), "roles"] == "local, block, sep, nsubj"
  assert per_head.loc[(0, 1), "roles"] == "(none)" and per_head.loc[(1, 0), "num_roles"] == 4


def test_roles_without_defined_tests_count_as_not_computed(tmp_path):
  tests = small_tests()
  tests.loc[tests["role"] == "block", ["mean", "assigned"]] = [np.nan, "False"]
  tests["n"] = np.where(tests["role"] == "block", 0, 10)
  assert "block" not in tables.tested_roles(tests)
  assert tables.tested_roles(small_tests().assign(n=10)) == ["local", "prev_local", "block", "cls",
                                                            "sep", "nsubj"]
  _, sets = tables.coarse_flags(tests, ("local", "syntactic", "block", "delimiter"))
  assert sets == ["local"]          # the syntactic and delimiter tests are not in this table
  text = analysis.write_report(tmp_path, title="t", settings=SETTINGS, summary={"share_block": 0.0},
                           tests_df=tests).read_text()
  row = re.search(r"Heads with the block role \(the run\S*s rule\)</td><td[^>]*>([^<]*)<", text).group(1)
  assert row == "not computed"


def test_assigned_matrix_and_sorted_heads():
  assigned = tables.assigned_matrix(small_tests(), style.GRID_ROLES)
  assert assigned.shape == (2, 2, 9)
  assert assigned[1, 0].sum() == 3  # nsubj, sep, block (local is not a grid role)
  assert assigned[0, 0, style.GRID_ROLES.index("cls")] and not assigned[0, 1].any()
  order = pande.sorted_heads(np.array([[[1, 0], [1, 1], [0, 0]], [[0, 0], [0, 0], [1, 0]]], bool))
  np.testing.assert_array_equal(order, [[1, 0, 2], [2, 0, 1]])


def test_upset_counts_by_hand():
  flags = pd.DataFrame({"a": [1, 1, 0, 0, 1], "b": [1, 0, 0, 0, 1]}).astype(bool)
  counts = pande.upset_counts(flags, ["a", "b"])
  assert counts.to_dict() == {(True, True): 2, (False, False): 2, (True, False): 1}
  assert list(counts.index)[0] == (True, True)  # largest first, ties: more sets first


def test_mean_matrix_places_values():
  means, roles = tables.mean_matrix(small_tests())
  assert roles == ["local", "prev_local", "block", "cls", "sep", "nsubj"]
  assert means.shape == (2, 2, 6)
  assert means[1, 1, roles.index("sep")] == pytest.approx(2.1)


def test_bad_inputs_have_clear_errors(tmp_path, data):
  with pytest.raises(ValueError, match="lacks columns"):
    pande.plot_role_grid(data["tests"].drop(columns=["assigned"]), tmp_path / "g.png")
  with pytest.raises(ValueError, match="assigned"):
    tables.check_tests_df(data["tests"].assign(assigned="maybe"))
  with pytest.raises(ValueError, match=r"\.png"):
    pande.plot_score_cdf([1.0, 2.0], tmp_path / "x.jpg", tau=3)
  with pytest.raises(ValueError, match="2 to 4 sets"):
    pande.plot_role_venn(data["tests"], tmp_path / "v.png", sets=("local",))
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    pande.plot_pvalue_hist([0.5, 1.5], tmp_path / "p.png")


# ------------------------------------------------------------------------------------------------
# figures


@pytest.mark.slow
def test_analysis_figures_write_pngs(drawn):
  assert set(drawn) == {"score_cdf", "pvalue_hist", "role_upset", "role_venn", "role_grid",
                        "role_heatmaps", "cluster_tsne", "cluster_layers", "cluster_features",
                        "type_masses", "score_distribution", "tau_sweep"}
  for name, path in drawn.items():
    assert path.name == f"{name}.png" and path.is_file()
    check_png(path)


def test_other_figures_write_pngs(tmp_path, data):
  t = data["tests"]
  paths = [
      pande.plot_role_upset(t, tmp_path / "upset_manual.png", dpi=DPI),
      pande.plot_role_venn(t, tmp_path / "venn2.png", sets=("local", "syntactic"), dpi=DPI),
      pande.plot_finetune_delta(data["compare"], tmp_path / "delta.png", dpi=DPI),
      pande.plot_finetune_delta(pd.concat([data["compare"].assign(task="mrpc"),
                                             data["compare"].assign(task="sst2")]),
                                  tmp_path / "delta_tasks.png", dpi=DPI),
      guan.plot_cluster_changes(data["changes"], tmp_path / "changes.png", dpi=DPI),
      pande.plot_role_upset(t.assign(assigned=False), tmp_path / "upset_none.png", dpi=DPI),
      pande.plot_role_venn(t.assign(assigned=False), tmp_path / "venn_none.png", dpi=DPI),
      pande.plot_score_cdf(np.full(5, np.nan), tmp_path / "cdf_empty.png", tau=3.0, dpi=DPI),
  ]
  for p in paths:
    assert p.is_file()
    check_png(p, min_bytes=1000)


def test_role_grid_marks_only_assigned_roles(tmp_path):
  """The grid's coloured markers must change when an assignment changes."""
  base = small_tests()
  a = check_png(pande.plot_role_grid(base, tmp_path / "a.png", dpi=DPI), min_bytes=1000)
  b = check_png(pande.plot_role_grid(base.assign(assigned="False"), tmp_path / "b.png", dpi=DPI),
                min_bytes=1000)
  assert a.shape == b.shape and np.abs(a - b).sum() > 0
  saturated = lambda img: (img[..., :3].max(-1) - img[..., :3].min(-1) > 0.3).sum()
  assert saturated(a) > saturated(b)  # role markers are coloured; an empty grid is grey


# ------------------------------------------------------------------------------------------------
# HTML


def data_uris(text):
  return re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)


def test_write_report_embeds_figures_and_tables(tmp_path, data, drawn):
  figs = drawn
  path = analysis.write_report(
      tmp_path, title="Run <1> & co", settings=SETTINGS, summary=SUMMARY, tests_df=data["tests"],
      clusters_df=data["clusters"],
      cluster_info={"names": ["dense", "diagonal"], "stability": 0.9, "method": "kmeans", "k": 2,
                    "name_scores": [[0.1, 0.2, 0.7], [0.5, 0.4, 0.1]],
                    "name_score_columns": ["vertical", "diagonal", "dense"]},
      figures=figs, extra_sections=[("Notes <b>", "first & second")])
  text = path.read_text()
  assert path.name == "report.html"
  uris = data_uris(text)
  assert len(uris) == len(figs)
  assert sorted(base64.b64decode(u) for u in uris) == sorted(p.read_bytes() for p in figs.values())
  for name in figs:
    assert f'id="fig-{page.slug(name)}"' in text
    assert page.esc(spec.figure(name).how) in text  # "how to read this" line
  for table in ("table-settings", "table-summary", "table-summary-other", "table-roles-per-layer",
                "table-roles-per-head", "table-cluster-info", "table-cluster-means",
                "table-clusters", "table-cluster-name-scores"):
    assert f'<table id="{table}">' in text
  scores_table = text[text.index('<table id="table-cluster-name-scores">'):]
  assert "<th>vertical</th><th>diagonal</th><th>dense</th>" in scores_table
  assert "<tr><td>diagonal</td><td class=\"num\">0.500</td>" in scores_table
  # escaping: nothing from the inputs becomes markup
  assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
  assert "Run &lt;1&gt; &amp; co" in text and "Notes &lt;b&gt;" in text
  assert "custom &lt;key&gt;" in text and "first &amp; second" in text
  # self-contained: no external resources
  assert not re.search(r'(src|href)="(https?:)?//', text)
  assert "<link" not in text and "<script" not in text
  # headline figures with the paper's references
  assert "41.2" not in text and "0.412" in text and "2.75" in text and "2.5%" in text
  assert "1.8%" in text and "2.8" in text and "75.0%" in text
  # every section is linked from the contents
  for sid in re.findall(r'<section id="([^"]+)"', text):
    assert f'href="#{sid}"' in text


def test_headline_rows_by_the_writers_keys_only():
  summary = {"share_unskilled": 0.2, "spearman_local_syntactic": 0.3, "odd": 1,
             "by_rule": {"paper": {"share_block": 0.125}}, "unskilled": 0.9}
  assert headline.lookup(summary, "by_rule.paper.share_block") == 0.125
  assert headline.summary_value(summary, "share_unskilled") == 0.2
  # no aliases: "unskilled" is not the writer's key, so it is just another entry
  assert ("unskilled", 0.9) in headline.other_entries(summary)
  assert ("odd", 1) in headline.other_entries(summary)
  assert all(k not in dict(headline.other_entries(summary))
             for k in ("share_unskilled", "by_rule.paper.share_block"))
  assert page.format_value(0.025, "share") == "2.5%"
  assert page.format_value(float("nan")) == "n/a"


def test_missing_figure_is_a_clear_error(tmp_path, data):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    analysis.write_report(tmp_path, title="t", settings=SETTINGS, summary={}, tests_df=data["tests"],
                      figures={"score_cdf": tmp_path / "nope.png"})


def test_compare_report(tmp_path, data):
  path = compare.write_compare_report(
      tmp_path, compare_df=data["compare"], heads_df=data["heads"],
      cluster_changes_df=data["changes"], settings={"before": {"model": "bert"},
                                                    "after": {"model": "bert-mrpc"}},
      summary_before=SUMMARY, summary_after={**SUMMARY, "share_local": 0.5}, dpi=DPI)
  text = path.read_text()
  uris = data_uris(text)
  assert len(uris) == 2
  for fig in ("finetune_delta", "cluster_changes"):
    assert (tmp_path / "figures" / f"{fig}.png").read_bytes() in [base64.b64decode(u) for u in uris]
  for table in ("table-settings-differ", "table-summary-compare", "table-delta", "table-compare",
                "table-role-change-counts", "table-role-changes", "table-cluster-changes"):
    assert f'<table id="{table}">' in text
  assert "2 of 12 heads gained or lost" in text
  n_changed = int(data["changes"]["changed"].sum())
  assert f"{n_changed} of 12 heads changed attention type" in text


def test_compare_report_shows_changed_settings_and_keeps_raw_keys_collapsed(tmp_path, data):
  """The headline rows, then only the settings that differ; every other summary key and setting
  in a collapsed appendix; a long text cell wraps (not a nowrap number cell)."""
  same = {f"setting_{i}": i for i in range(40)}
  lost = ";".join(f"{l}:{h}" for l in range(6) for h in range(10))[:400]
  path = compare.write_compare_report(
      tmp_path, compare_df=data["compare"],
      settings={"title": "t", "before": {**same, "model": "bert"}, "after": {**same, "model": "bert-mrpc"}},
      summary_before={**SUMMARY, "extra_key": 1.0},
      summary_after={**SUMMARY, "share_local": 0.5, "extra_key": 2.0, "lost_heads": lost}, dpi=DPI)
  text = path.read_text()
  differ = text.split('<table id="table-settings-differ">')[1].split("</table>")[0]
  assert "<td>model</td>" in differ and "setting_3" not in differ
  assert "1 of 41" in text
  before_appendix, appendix = text.split('<details class="appendix">', 1)
  assert "setting_3" not in before_appendix.split('<table id="table-settings-differ">')[0].split("Settings")[-1]
  assert "extra_key" not in text.split('<table id="table-summary-compare">')[1].split("</table>")[0]
  assert "extra_key" in appendix and "setting_3" in appendix
  assert f'<td class="text">{lost}</td>' in text  # wraps (page.css: td.text overflow-wrap)
  assert text.index("Headline figures before and after") < text.index(">Settings<")


def write_analysis_dir(out, scores, tests_df, clusters_df=None, summary=None):
  out.mkdir(parents=True, exist_ok=True)
  np.savez(out / "scores.npz", **scores)
  tests_df.to_csv(out / "tests.csv", index=False)
  (out / "tests.json").write_text(json.dumps({"settings": SETTINGS,
                                              "tests": tests_df.to_dict("records")}))
  if clusters_df is not None:
    clusters_df.to_csv(out / "clusters.csv", index=False)
    (out / "clusters.json").write_text(json.dumps({"names": ["dense", "diagonal"], "k": 4,
                                                   "stability": 0.93, "method": "kmeans"}))
  if summary is not None:
    (out / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_build_analysis_report_from_files(tmp_path, data):
  write_analysis_dir(tmp_path / "run", data["scores"], data["tests"], data["clusters"], SUMMARY)
  path = analysis.build_analysis_report(tmp_path / "run", dpi=DPI)
  text = path.read_text()
  assert len(data_uris(text)) == 12  # 11 + the Guan type masses
  assert len(list((tmp_path / "run" / "figures").glob("*.png"))) == 12
  assert "Attention heads: tiny &lt;script&gt;" in text
  assert "0.93" in text  # cluster info from clusters.json
  # without clusters or summary: fewer figures, still a report
  write_analysis_dir(tmp_path / "bare", data["scores"], data["tests"])
  text = analysis.build_analysis_report(tmp_path / "bare", dpi=DPI).read_text()
  assert len(data_uris(text)) == 8 and "table-clusters" not in text
  assert "not reported" in text
  with pytest.raises(FileNotFoundError, match="scores.npz"):
    analysis.build_analysis_report(tmp_path / "nothing")


def test_report_reads_what_hoststats_writes(tmp_path):
  """Integration: the host statistics' own writers and summary keys feed the report."""
  from heads_jax import contract
  from heads_jax.hoststats import hypothesis
  from heads_jax.hoststats import summary as summary_lib
  scores = make_scores(n=8, layers=2, heads=3)
  tests_df, settings = hypothesis.hypothesis_tests(scores["sieve_bias"], list(scores["roles"]),
                                                   settings={"model": "m", "data": "d"})
  summary = summary_lib.summary_figures(scores["sieve_bias"], list(scores["roles"]), tests_df)
  out = tmp_path / "run"
  contract.write_scores(out, scores["sieve_bias"], list(scores["roles"]), scores["distance"],
                  scores["lengths"])
  contract.write_tests(tests_df, settings, out)
  contract.write_summary(summary, out)
  text = analysis.build_analysis_report(out, dpi=DPI).read_text()
  headline = text[text.index('<table id="table-summary">'):]
  headline = headline[:headline.index("</table>")]
  assert "not reported" not in headline  # every headline key of hoststats is recognised
  assert page.format_value(summary["mean_sieve_score"], "float") in headline
  assert page.format_value(summary["share_p_between"], "share") in headline
  assert "Attention heads: m on d" in text


def test_as_bool_reads_csv_spellings():
  np.testing.assert_array_equal(tables.as_bool(["True", "false", "", None, "1"]),
                                [True, False, False, False, True])
  np.testing.assert_array_equal(tables.as_bool([1.0, np.nan, 0.0]), [True, False, False])


def test_report_imports_no_jax():
  modules = ["page", "style", "tables", "headline", "analysis", "compare", "ablation", "measures",
             "index"] + [f"figures.{m}" for m in ("common", "pande", "guan", "clark", "michel",
                                                   "kovaleva")]
  code = ("import sys; " + "; ".join(f"import heads_jax.report.{m}" for m in modules)
          + "; sys.exit(1 if 'jax' in sys.modules else 0)")
  assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ------------------------------------------------------------------------------------------------
# screenshot (optional system dependency: Chromium)


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"),
                    reason="Chromium is not installed (optional, only for screenshots)")
def test_screenshot_is_not_blank(tmp_path, data):
  figs = {"score_cdf": pande.plot_score_cdf(data["scores"]["sieve_bias"],
                                              tmp_path / "f" / "cdf.png", tau=3.0, dpi=DPI)}
  page = analysis.write_report(tmp_path, title="Screenshot", settings=SETTINGS, summary=SUMMARY,
                           tests_df=data["tests"], figures=figs)
  shot = tmp_path / "shot.png"
  result = subprocess.run([sys.executable, str(REPO / "scripts" / "screenshot.py"), str(page),
                           "--out", str(shot)], capture_output=True, text=True, timeout=180)
  assert result.returncode == 0, result.stderr
  img = check_png(shot, min_bytes=10_000)
  assert img.shape[1] == 1400 and img.shape[0] > 1000  # full page, taller than one screen


def test_a_full_disk_while_writing_a_page_names_the_page(tmp_path, monkeypatch):
  import errno

  from heads_jax.cli import user_message

  def full(self, *a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")  # as a write's error: no file name
  monkeypatch.setattr(Path, "write_text", full)
  with pytest.raises(OSError) as e:
    page.write_page(tmp_path, title="t", sections=[("s", "<p>x</p>")])
  message = user_message(e.value)
  assert str(tmp_path / "report.html") in message and "no space left on the device" in message


def test_table_cells_with_long_text_wrap_and_short_ones_do_not():
  """A list of heads (the norm weighting's lost_heads) wraps in its cell instead of running off the
  page; short text and numbers keep their own cells."""
  from heads_jax.report.page import table_html
  heads = ",".join(f"{l}:{h}" for l in range(6) for h in range(12))
  html = table_html(pd.DataFrame({"role": ["local"], "lost": [3], "lost_heads": [heads]}))
  assert f'<td class="text">{heads}</td>' in html
  assert "<td>local</td>" in html and '<td class="num">3</td>' in html


def test_a_full_disk_while_drawing_names_the_figure(tmp_path, monkeypatch):
  """ENOSPC from a figure's write names the file (cli.user_message), never a bare [Errno 28]."""
  import errno
  from matplotlib.figure import Figure
  from heads_jax.cli import user_message
  from heads_jax.report.figures.common import new_figure, save_figure

  def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(Figure, "savefig", full)
  with pytest.raises(OSError) as e:
    save_figure(new_figure(2, 2), tmp_path / "f.png", dpi=50)
  line = user_message(e.value)
  assert line.startswith(f"{tmp_path / 'f.png'}: no space left on the device; free some space")


def test_the_rules_section_shows_windowed_and_global_layers_apart():
  """A ModernBERT-style run (settings name its windowed layers): the role shares of its local and
  global layers in a table of their own; a BERT run's section has none."""
  from heads_jax.report.analysis import _rules_section
  rows = [dict(layer=l, head=h, role=r, mean=1.0, n=3, std=0.0, p_value=0.5, p_adjusted=0.5,
               assigned=(l == 1 and r == "local"), assigned_paper=(l == 1 and r == "local"),
               assigned_calibrated=(l == 1 and r == "local"), mean_minus_uniform=0.0)
          for l in range(3) for h in range(2) for r in ("local", "delimiter")]
  tests_df = pd.DataFrame(rows)
  settings = {"rule": "calibrated", "windowed_layers": [1, 2], "window": 64,
              "near_uniform_heads": ["2:0"]}
  html = _rules_section(tests_df, settings, {})
  table = html.split('id="table-layer-kinds"')[1].split("</table>")[0]
  assert "local layers (2 x 2 heads)" in table and "global layers (1 x 2 heads)" in table
  local_row = table.split("<td>local</td>")[1].split("</tr>")[0]
  assert ">50.0%<" in local_row and ">0.0%<" in local_row   # local layers 2 of 4, global 0 of 2
  assert "within 64 positions" in html
  assert "table-layer-kinds" not in _rules_section(tests_df, {"rule": "calibrated"}, {})


def test_the_role_grid_marks_windowed_layers(tmp_path, data):
  """Fig. 5 of a model with windowed layers labels each layer local or global; BERT's keeps plain
  layer numbers."""
  import matplotlib.axes
  from heads_jax.report.figures import pande
  labels = []
  real = matplotlib.axes.Axes.set_yticks

  def spy(self, ticks, tick_labels=None, **kw):
    labels.append(list(tick_labels or []))
    return real(self, ticks, tick_labels, **kw)

  matplotlib.axes.Axes.set_yticks = spy
  try:
    pande.plot_role_grid(data["tests"], tmp_path / "w.png", windowed_layers=(1,), dpi=DPI)
    pande.plot_role_grid(data["tests"], tmp_path / "p.png", dpi=DPI)
  finally:
    matplotlib.axes.Axes.set_yticks = real
  assert labels[0][:2] == ["0 (global)", "1 (local)"]
  assert labels[1][:2] == ["0", "1"]


def test_hidden_state_norms_at_the_sinks_in_a_table():
  """The second pass's hidden-state norm ratios per layer (massive activations) as a table; none
  without them."""
  from heads_jax.report.robustness import _activations_html
  html = _activations_html({"first_norm_ratio_by_layer": [0.7, 0.68, 12.5],
                            "sep_norm_ratio_by_layer": [1.1, None, 0.9]})
  assert 'id="table-hidden-norms"' in html and "<td>embeddings</td>" in html
  assert '<td class="num">12.500</td>' in html or ">12.50<" in html
  assert _activations_html({}) == ""
