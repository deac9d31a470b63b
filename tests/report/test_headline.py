"""The one headline table (`heads_jax.report.headline`): rows keyed as hoststats writes them, one
formatter, the console line and the HTML table on hand values."""

import numpy as np

from heads_jax.hoststats import summary as summary_lib
from heads_jax.report import headline, page
from tests.report.test_report import make_scores


def test_the_one_formatter_on_hand_values():
  f = page.format_value
  assert f(0.025, "share") == "2.5%" and f(1.0, "share") == "100.0%"
  assert f(1.5, "share") == "1.5"  # not a share: 4 significant digits
  assert f(0.41234, "corr") == "0.412" and f(-0.5, "corr") == "-0.500"
  assert f(0.000123, "p") == "0.00012" and f(0.0, "p") == "< 1e-300"
  assert f(2.754, "float") == "2.75" and f(3.14159) == "3.142"
  assert f(12345) == "12,345" and f(None) == "n/a" and f(float("nan"), "share") == "n/a"
  assert f(np.float32(0.5), "share") == "50.0%" and f(True) == "yes"


def test_every_row_key_is_written_by_hoststats():
  scores = make_scores(n=8, layers=2, heads=3)
  from heads_jax.hoststats import hypothesis
  tests_df, _ = hypothesis.hypothesis_tests(scores["sieve_bias"], list(scores["roles"]),
                                            settings={"model": "m", "data": "d"})
  summary = summary_lib.summary_figures(scores["sieve_bias"], list(scores["roles"]), tests_df)
  for row in headline.ROWS:
    assert row.optional or headline.present(summary, row.key), row.key
  assert len({r.key for r in headline.ROWS}) == len(headline.ROWS)


def test_console_line_and_table_on_hand_values():
  s = {"rule": "calibrated", "share_delimiter": 0.25, "spearman_local_syntactic": 0.41234,
       "mean_sieve_score": 2.754, "share_p_between": 0.025, "share_block": None,
       "by_rule": {"paper": {"share_block": 0.5}}}
  text = headline.headline_text(s)
  assert text.startswith("calibrated rule: delimiter heads 25.0%; block n/a; block (paper's rule) 50.0%")
  assert "Spearman(local, syntactic) 0.412" in text and "mean sieve score 2.75" in text
  assert "p-values in (0.05, 0.95) 2.5%" in text and "local 0" not in text  # absent: left out
  table = headline.headline_table({"a": s, "b": {}}).set_index("figure")
  label = "Heads with the delimiter role (its test rejects; the run's rule)"
  assert table.loc[label, "a"] == "25.0%"
  # the paper's value stands beside the paper's rule's share, not the run's (calibrated) rule's
  assert table.loc[label, "paper (BERT-base)"] == "-"
  assert table.loc["Heads with the local role (|s - t| <= 2; the run's rule)", "a"] == "not reported"
  both = headline.headline_table({"a": {**s, "by_rule": {"paper": {"share_delimiter": 0.7}}}})
  row = both.set_index("figure").loc["... delimiter heads under the paper's rule"]
  assert row["a"] == "70.0%" and row["paper (BERT-base)"].startswith("73.43%")
  assert table.loc["... block heads under the paper's rule (tau only)", "b"] == "not reported"
  paper = table.loc["Mean of all sieve bias scores", "paper (BERT-base)"]
  assert paper == headline.paper_value("mean_sieve_score") and "2.8" in paper  # hoststats.claims
  assert "Heads with near-uniform attention (no role)" not in table.index  # optional, absent
  html = headline.headline_html({"x<y": s}, label_header="headline figure")
  assert "<th>x&lt;y</th>" in html and '<td class="num">25.0%</td>' in html
  cut = headline.headline_table({"a": s}, tested={"a": ["local"]}).set_index("figure")
  assert cut.loc["Heads with the block role (the run's rule)", "a"] == "not computed"
