"""report/guan.py: the guan pipeline's report judges Guan et al.'s claims in their setting."""

import pandas as pd
import pytest

from heads_jax import contract
from heads_jax.hoststats import claims as paper, clustering
from heads_jax.report import guan as guan_report
from tests.hoststats.test_clustering import _planted


def _analysis_dir(path, seed):
  """An analysis directory: tests.csv (no role assigned), summary.json and a real clustering of
  planted heads (the four types, 96 heads each, in Guan et al.'s shape: 24 layers x 16 heads)."""
  x, _ = _planted(per=96, seed=seed)
  x = x.reshape(x.shape[0], 24, 16, 21)
  rows = [{"layer": l, "head": h, "role": r, "mean": 1.0, "n": 3, "statistic": -1.0,
           "p_value": 0.9, "p_adjusted": 0.9, "assigned": False}
          for l in range(24) for h in range(16) for r in ("local", "delimiter", "cls", "sep")]
  contract.write_tests(pd.DataFrame(rows), {"tau": 3.0}, path)
  contract.write_summary({}, path)
  df, info = clustering.cluster_heads(x, n_init=2, tsne=False, stability_fits=3)
  contract.write_clusters(df, info, path)
  return path


def _tables():
  rows = [{"table": 2 if i <= 11 else 3, "id": i, "setting": "", "num_heads": 0,
           "missing_types": "", "exact_match": em / 100, "f1": f1 / 100,
           "paper_exact_match": em / 100, "paper_f1": f1 / 100}
          for i, _, em, f1 in paper.GUAN_TABLE2 + paper.GUAN_TABLE3]
  return pd.DataFrame(rows)


@pytest.mark.slow
def test_guan_report_judges_in_guans_setting(tmp_path):
  analyses = {"squad": _analysis_dir(tmp_path / "a" / "squad", 0),
              "pretrained": _analysis_dir(tmp_path / "a" / "pretrained", 1)}
  out = guan_report.write_guan_report(tmp_path, analyses=analyses, squad_model=guan_report.GUAN_MODEL,
                                      tables=_tables(), questions=10570)
  claims = pd.read_csv(out["claims"], keep_default_na=False).set_index("key")
  assert list(claims.index) == [c.key for c in paper.claims(paper.GUAN)]
  assert paper.NOT_COMPARABLE not in set(claims["verdict"])
  # the paper's own EM beside itself: every row and statement of Tables 2-3 holds, in percent
  for c in paper.claims(paper.GUAN):
    if c.check.startswith("squad"):
      assert claims.loc[c.key, "verdict"] == paper.HOLDS, c.key
  assert claims.loc["guan_table2_row1", "this_run"] == "82.85"
  assert claims.loc["guan_table2_row1", "value_this_run"] == "82.85"        # no float noise
  # 96 of 384 heads of each type: 25% is inside the Wilson interval of the dense and diagonal
  # shares (26.04%, 25.56%), not of dense+vertical's (34.11%)
  for n in ("dense", "diagonal"):
    assert claims.loc[f"guan_share_{n}", "verdict"] == paper.HOLDS
  assert claims.loc["guan_share_dense_vertical", "verdict"] == paper.FAILS
  assert claims.loc["guan_stability_squad", "verdict"] in (paper.HOLDS, paper.FAILS)
  assert claims.loc["guan_stable_3_5", "verdict"] in (paper.HOLDS, paper.FAILS)
  html = (tmp_path / "report.html").read_text()
  assert "table-guan-claims" in html and "table-guan-naming" in html and "margin" in html
  naming = guan_report.naming_table(analyses)
  assert list(naming["type"][:4]) == list(clustering.CLUSTER_NAMES)
  assert (naming["check"] == "ok").all()
  # another SQuAD model: the numbers are not comparable, the statements still judged
  out = guan_report.write_guan_report(tmp_path, analyses=analyses, squad_model="runs/tiny/best_model",
                                      tables=_tables(), questions=10570)
  claims = pd.read_csv(out["claims"], keep_default_na=False).set_index("key")
  assert claims.loc["guan_table2_row3", "verdict"] == paper.NOT_COMPARABLE
  assert claims.loc["guan_table2_row3", "this_run"] == "4.59"
  assert claims.loc["guan_prune_diagonal", "verdict"] == paper.HOLDS
  assert guan_report.is_guans_model("/cache/google-bert/" + guan_report.GUAN_MODEL + "/")
  # Guan et al.'s model by name but not by shape (a local copy of another model): not theirs
  small = {"squad": _analysis_dir(tmp_path / "b" / "squad", 0)}
  x, _ = _planted(seed=2)
  df, info = clustering.cluster_heads(x, n_init=2, tsne=False, stability_fits=0)
  contract.write_clusters(df, info, small["squad"])
  rows = [{"layer": l, "head": h, "role": "local", "mean": 1.0, "n": 3, "statistic": -1.0,
           "p_value": 0.9, "p_adjusted": 0.9, "assigned": False} for l in range(4) for h in range(10)]
  contract.write_tests(pd.DataFrame(rows), {"tau": 3.0}, small["squad"])
  run = guan_report.guan_run_figures(small, squad_model=guan_report.GUAN_MODEL)
  assert run.setting == "guan_other"
