"""The demo's front page (heads_jax.report.index): the headline table of every analysed model
and the registered role-grid and fine-tuning figures, from files the stages wrote."""

from heads_jax import contract
from heads_jax.report import index, page, spec
from tests.report.test_report import DPI, make_compare, make_scores, make_tests_df


def test_front_page_headlines_and_registered_figures(tmp_path):
  scores = make_scores(n=4, layers=2, heads=3)
  tests_df = make_tests_df(scores["sieve_bias"], scores["roles"])
  analyses = {}
  for name, share in (("pre-trained", 0.25), ("fine-tuned", 0.5)):
    d = tmp_path / name
    contract.write_summary({"share_local": share, "mean_sieve_score": 2.754}, d)
    spec.draw("analysis", spec.Inputs(tests_df=tests_df), d / "figures", dpi=DPI,
              names=("role_grid",))
    analyses[name] = d
  cmp = tmp_path / "compare"
  spec.draw("compare", spec.Inputs(compare_df=make_compare()[0]), cmp / "figures", dpi=DPI,
            names=("finetune_delta",))
  text = index.write_index(tmp_path / "out", {"analyses": analyses, "compare": cmp}).read_text()
  table = text[text.index("Headline findings"):]
  table = table[:table.index("</table>")]
  assert "<th>pre-trained</th>" in table and "<th>fine-tuned</th>" in table
  assert "25.0%" in table and "50.0%" in table and "2.75" in table
  grid, delta = spec.figure("role_grid"), spec.figure("finetune_delta")
  for name in analyses:
    assert f"{grid.title}: {name}" in text
  assert text.count(page.esc(grid.caption)) == 2 and page.esc(delta.caption) in text
  assert text.count("data:image/png;base64,") == 3
