"""The reports' reference column comes from assets/reference.json (scripts/reference_values.py),
and README quotes it."""
from __future__ import annotations

import re

from heads_jax.report import headline
from tests.helpers import REPO


def test_reference_file_has_every_headline_row_and_its_command():
  ref = headline.reference()
  assert ref["command"].startswith("heads-jax analyze --model all-MiniLM-L6-v2 --data ud-ewt")
  assert "--max-examples 200" in ref["command"]
  assert {r.key for r in headline.ROWS} == set(ref["figures"])
  block = headline.ROW_BY_KEY["share_block"]
  assert headline.reference_value(block).startswith("n/a (")   # single sentences: no block test


def test_readme_quotes_the_reference_figures():
  readme = " ".join((REPO / "README.md").read_text().split())
  found = re.search(r"200 UD EWT test sentences the mean sieve score is ([\d.]+) and ([\d.]+)% of "
                    r"p-values", readme)
  assert found, "README's reference sentence changed form; update this test"
  mean = headline.reference_value(headline.ROW_BY_KEY["mean_sieve_score"])
  between = headline.reference_value(headline.ROW_BY_KEY["share_p_between"])
  assert (found.group(1), found.group(2) + "%") == (mean, between)
