"""The demo: quick mode end to end (the README's first command, in its fast form), and the
full mode's stages on a very short schedule."""

import pytest

from heads_jax.demo import run_demo
from tests.helpers import minilm_dir


@pytest.mark.slow
def test_quick_demo_writes_report(tmp_path):
  logs = []
  report = run_demo(tmp_path / "demo", quick=True, log=logs.append)
  html = report.read_text()
  assert report.name == "report.html" and "Headline findings" in html and "Roles per head" in html
  sub = tmp_path / "demo" / "analysis" / "quick"
  for name in ("scores.npz", "tests.csv", "tests.json", "clusters.csv", "report.html"):
    assert (sub / name).is_file(), name
  assert any("report:" in m for m in logs) and any("delimiter heads" in m for m in logs)
  # Re-running reuses the analysis.
  logs.clear()
  run_demo(tmp_path / "demo", quick=True, log=logs.append)
  assert any("reusing" in m for m in logs)


@pytest.mark.slow
def test_full_demo_stages_on_a_short_schedule(tmp_path):
  """Pre-train, fine-tune, analyse, compare and the front page, with a few steps each."""
  logs = []
  report = run_demo(tmp_path / "demo", pretrain_steps=4, finetune_steps=4, analysis_examples=12,
                    log=logs.append)
  html = report.read_text()
  for section in ("Training", "Headline findings", "Effect of fine-tuning"):
    assert section in html, section
  out = tmp_path / "demo"
  assert (out / "pretrain" / "model" / "heads_jax.json").is_file()
  assert (out / "finetune_sst2" / "best_model" / "heads_jax.json").is_file()
  assert (out / "compare" / "compare_sieve_bias.csv").is_file()
  assert (out / "analysis" / "finetuned" / "report.html").is_file()
  if minilm_dir() is not None:
    assert (out / "analysis" / "minilm" / "report.html").is_file()
  assert any("accuracy" in m for m in logs)
