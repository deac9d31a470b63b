"""The analysis job's state and inputs (issue 28 part 2): what a directory is, reuse keyed on the
content of the model and data, damaged files, values checked before any work, and the counts of
truncated, empty and duplicated sequences. Each case notes the behaviour before the fix."""

import dataclasses
import json
import os

import numpy as np
import pytest

from heads_jax import contract, runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines import analyze
from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
from tests.test_cli_errors import _tiny_model_dir
from tests.test_runfiles import swap_bytes_keep_stat

SENTENCES = ["The cat sat on the mat .", "A dog ran home .", "Birds fly south in winter .",
             "She reads a book every night .", "We walked to the old bridge ."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return _tiny_model_dir(tmp_path_factory.mktemp("model") / "m")


def _cfg(model_dir, data_file, out, **kw) -> AnalysisConfig:
  kw = {"syntax": False, "measures": False, "examples": 0, "report": False, "batch_size": 8,
        "max_length": 32, "clusters": 2, **kw}
  return AnalysisConfig(model=str(model_dir), data=(f"text:{data_file}",), out=str(out), **kw)


def _run(cfg, **kw):
  logs = []
  host = run_analysis(cfg, progress=False, log=logs.append, **kw)
  return host, "\n".join(map(str, logs))


@pytest.mark.slow
def test_long_line_is_analysed_truncated_counted_and_n1_warned(tmp_path, model_dir):
  # Before: one line of 2,000 words ended with "max() arg is an empty sequence" (the head view
  # found no example); a sequence cut at --max-length was counted nowhere; n = 1 was reported as
  # "no role 100.0%" without a word.
  data = tmp_path / "long.txt"
  data.write_text(" ".join(f"word{i % 50}" for i in range(2000)) + "\n")
  cfg = _cfg(model_dir, data, tmp_path / "o", examples=3)
  host, log = _run(cfg)
  assert host["tests"]["n"].max() == 1
  assert f"text:{data}: 1 read, 1 truncated to 32 wordpieces" in log
  assert "warning: only 1 sequence(s): no test can run" in log
  run = contract.read_run(tmp_path / "o")
  info = run["data_info"][0]
  assert (info["num_read"], info["num_truncated"], info["num_empty_dropped"]) == (1, 1, 0)
  # the statistics path asked for and the one taken (the CPU's, the maps fit: issue 50 item 8)
  assert (run["device"]["stats_impl"], run["device"]["stats_paths"]) == ("auto", ["layerwise"])
  settings = json.loads((tmp_path / "o" / contract.SETTINGS_JSON).read_text())
  assert settings["sequences_truncated"] == 1 and "only 1 sequence(s)" in settings["warnings"]
  assert (tmp_path / "o" / contract.EXAMPLES_JSON).is_file()


def test_empty_and_duplicated_sequences(tmp_path, model_dir):
  # Before: a line with no wordpiece became an empty [CLS] [SEP] sequence counted in the tests;
  # repeated sentences were counted nowhere; the same --data twice doubled every n.
  data = tmp_path / "s.txt"
  data.write_text("\n".join(SENTENCES + ["\u200b", SENTENCES[0]]) + "\n")
  host, log = _run(_cfg(model_dir, data, tmp_path / "o"))
  assert contract.read_scores(tmp_path / "o").num_sequences == 6  # 7 read, the empty one dropped
  assert "7 read, 1 with no wordpiece dropped, 1 duplicate(s) of an earlier example (kept)" in log
  settings = json.loads((tmp_path / "o" / contract.SETTINGS_JSON).read_text())
  assert (settings["sequences_empty_dropped"], settings["sequences_duplicated"]) == (1, 1)
  # roles this run could not compute (single sentences: no block; no arcs): said, not counted
  # as 0 heads in the console's table (issue 43 item 1); the settings name each data set's arcs
  assert "not computed: " in log and "block (no sequence pairs" in log
  table = log.split("heads per role and layer")[1].split("not computed")[0]
  assert "block" not in table
  assert settings["arcs"] == f"text:{data}: none (no parse)"
  twice = dataclasses.replace(_cfg(model_dir, data, tmp_path / "o2"),
                              data=(f"text:{data}", f"text:{data}"))
  with pytest.raises(UserError, match="names the same data as .* counted twice"):
    _run(twice)
  assert not (tmp_path / "o2").exists()


@pytest.mark.slow  # ~35 s alone (six analyses of a tiny model), more on a loaded machine
def test_reuse_keys_on_content_and_damaged_files(tmp_path, model_dir):
  data = tmp_path / "s.txt"
  data.write_text("\n".join(SENTENCES) + "\n")
  out = tmp_path / "o"
  cfg = _cfg(model_dir, data, out)
  _run(cfg)
  assert runfiles.read_job(out)["kind"] == "analysis"
  stamp = (out / contract.SCORES_FILE).stat().st_mtime_ns
  # another tau: scores.npz reused; a report.html of the earlier tests (here a stand-in) goes
  # (before: it stayed beside the new tests)
  (out / contract.REPORT_HTML).write_text("<html>tau 3</html>")
  _, log = _run(dataclasses.replace(cfg, tau=2.0))
  assert "reusing" in log and (out / contract.SCORES_FILE).stat().st_mtime_ns == stamp
  assert not (out / contract.REPORT_HTML).exists() and "removed the earlier report.html" in log

  # the data file behind the same path changes (before: "reusing scores.npz (same model and
  # data)" and the old run reported)
  data.write_text("\n".join(SENTENCES[:3]) + "\n")
  with pytest.raises(FileExistsError, match="the data behind the same path.* changed"):
    _run(cfg)
  _, log = _run(cfg, overwrite=True)
  assert "reusing" not in log and contract.read_scores(out).num_sequences == 3

  # the model directory behind the same path changes (its weights rewritten to the same size,
  # the mtime set back); a new mtime alone is the same content: reused
  weights = model_dir / "params.safetensors"
  saved = weights.read_bytes()
  os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
  assert "reusing" in _run(cfg)[1]
  try:
    swap_bytes_keep_stat(weights)
    with pytest.raises(FileExistsError, match="the model behind the same path.* changed"):
      _run(cfg)
  finally:
    weights.write_bytes(saved)
  assert "reusing" in _run(cfg)[1]

  # a truncated scores.npz: one line (before: BadZipFile), and --overwrite computes it again
  # (before: --overwrite reused the broken file)
  raw = (out / contract.SCORES_FILE).read_bytes()
  (out / contract.SCORES_FILE).write_bytes(raw[: len(raw) // 2])
  with pytest.raises(UserError, match="scores.npz is damaged or not an npz file .*--overwrite"):
    _run(cfg)
  _, log = _run(cfg, overwrite=True)
  assert "reusing" not in log and contract.read_scores(out).num_sequences == 3

  # a corrupt run.json names the file and the flag (before: "re-run the stage that wrote it")
  (out / contract.RUN_FILE).write_text("{not json")
  with pytest.raises(UserError) as e:
    _run(cfg)
  assert f"{out / contract.RUN_FILE} is not valid JSON" in str(e.value)
  assert "pass --overwrite" in str(e.value) and "re-run the stage" not in str(e.value)
  _run(cfg, overwrite=True)
  assert contract.read_run(out)["inputs"]["data"][0]["files"][0][0][1] == data.stat().st_size


@pytest.mark.parametrize("field,value,words", [
    ("tau", float("nan"), "--tau must be a number >= 0"), ("tau", -1.0, "--tau must be a number >= 0"),
    ("alpha", 0.0, "--alpha must be"), ("alpha", 1.5, "--alpha must be"),
    ("examples", -1, "--examples must be an integer >= 0"),
    ("clusters", 0, "--clusters must be an integer >= 1"),
    ("max_examples", 0, "--max-examples must be a positive"),
    ("max_examples", -1, "--max-examples must be a positive"),
    ("batch_size", 0, "--batch-size must be"),
    ("stats_impl", "fast", "--stats-impl must be one of auto, layerwise"),
])
def test_values_checked_before_any_work(tmp_path, monkeypatch, model_dir, field, value, words):
  # Before: --tau nan/-1, --alpha, --clusters 0 were refused after the device pass or accepted;
  # --max-examples 0/-1 blamed the data.
  monkeypatch.setattr(analyze, "compute_scores", lambda *a, **k: pytest.fail("device pass ran"))
  data = tmp_path / "s.txt"
  data.write_text("one line\n")
  with pytest.raises(UserError, match=words):
    _run(dataclasses.replace(_cfg(model_dir, data, tmp_path / "o"), **{field: value}))
  assert not (tmp_path / "o").exists()


def test_directories_of_other_jobs_and_files_are_refused(tmp_path, monkeypatch, model_dir):
  monkeypatch.setattr(analyze, "compute_scores", lambda *a, **k: pytest.fail("device pass ran"))
  data = tmp_path / "s.txt"
  data.write_text("one line\n")
  # a fine-tuning work directory (before: its summary.json was overwritten)
  ft = tmp_path / "ft"
  (ft / "checkpoints").mkdir(parents=True)
  (ft / "summary.json").write_text('{"best": 0.9}')
  with pytest.raises(UserError, match="is a training directory .* choose another --out"):
    _run(_cfg(model_dir, data, ft))
  assert (ft / "summary.json").read_text() == '{"best": 0.9}'
  assert sorted(p.name for p in ft.iterdir()) == ["checkpoints", "summary.json"]
  # a marked directory of another kind
  cmp = tmp_path / "cmp"
  runfiles.claim_dir(cmp, "comparison")
  with pytest.raises(UserError, match="is a comparison directory"):
    _run(_cfg(model_dir, data, cmp))
  # a file as --out: one line, before any work
  f = tmp_path / "file"
  f.write_text("x")
  with pytest.raises(UserError, match="--out .* is a file; give a directory"):
    _run(_cfg(model_dir, data, f))
  assert f.read_text() == "x"


def test_an_early_error_leaves_no_empty_out(tmp_path, model_dir):
  # Before: an error in the device pass (here: the data holds no sequence) left an empty --out.
  data = tmp_path / "s.txt"
  data.write_text("\u200b\n")
  with pytest.raises(ValueError, match="holds no examples \\(1 with no wordpiece dropped\\)"):
    _run(_cfg(model_dir, data, tmp_path / "o"))
  assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_vocabulary_larger_than_the_embeddings_is_refused_before_the_pass(tmp_path, monkeypatch):
  # Before: the pass ran, failed with a wrong cause and left all-NaN outputs.
  small = _tiny_model_dir(tmp_path / "v97", vocab_size=97)  # the 30,522-piece tokenizer beside it
  from heads_jax.pipelines import device_pass
  monkeypatch.setattr(device_pass, "collect", lambda *a, **k: pytest.fail("device pass ran"))
  data = tmp_path / "s.txt"
  data.write_text("one line\n")
  with pytest.raises(UserError, match="has 30522 pieces but the model embeds only 97"):
    _run(_cfg(small, data, tmp_path / "o"))
  assert not (tmp_path / "o").exists()


def test_more_clusters_than_heads_is_refused_before_the_pass(tmp_path, monkeypatch, model_dir):
  # Before: the clustering refused it after the device pass.
  from heads_jax.pipelines import device_pass
  monkeypatch.setattr(device_pass, "collect", lambda *a, **k: pytest.fail("device pass ran"))
  data = tmp_path / "s.txt"
  data.write_text("one line\n")
  with pytest.raises(UserError, match="--clusters 9 is more than the model's 8 heads"):
    _run(_cfg(model_dir, data, tmp_path / "o", clusters=9))
  assert not (tmp_path / "o").exists()


def test_an_analysis_directory_in_use_is_refused_then_released(tmp_path, model_dir):
  from tests.pipelines.test_engine import _held_by_another_process
  data = tmp_path / "s.txt"
  data.write_text("The cat sat on the mat.\nA dog ran in the park today.\nBirds sing.\n")
  out = tmp_path / "out"
  pid = _held_by_another_process(out, "an analysis")
  with pytest.raises(UserError, match=rf"is in use by an analysis \(pid {pid} on this host"):
    _run(_cfg(model_dir, data, out))
  assert not (out / contract.SCORES_FILE).exists()
  (out / ".heads_jax.lock").unlink()
  _run(_cfg(model_dir, data, out))
  assert (out / contract.SCORES_FILE).is_file() and not (out / ".heads_jax.lock").exists()


@pytest.mark.slow  # three analyses of a tiny model, and torch to write it
def test_a_hub_id_whose_ref_moved_is_another_model(tmp_path, monkeypatch):
  """issue 34: ``analyze --model ID`` after the cache's refs/main moved to a new snapshot
  (before: "reusing scores.npz (same model and data)", the key of a hub id being constant)."""
  pytest.importorskip("torch")
  import shutil
  from tests.test_hub import COMMIT, write_cached_model
  cache = tmp_path / "hf_home"
  monkeypatch.setenv("HF_HOME", str(cache))
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.chdir(tmp_path)
  snap = write_cached_model(cache / "hub", "org/tiny-bert", family="bert")
  other = "f" * 40
  shutil.copytree(snap, snap.parent / other)
  data = tmp_path / "s.txt"
  data.write_text("\n".join(SENTENCES) + "\n")
  cfg = dataclasses.replace(_cfg("org/tiny-bert", data, tmp_path / "o"), model="org/tiny-bert")
  _run(cfg)
  assert contract.read_run(tmp_path / "o")["inputs"]["model"] == {"hub": "org/tiny-bert",
                                                                  "commit": COMMIT}
  assert "reusing" in _run(cfg)[1]
  (snap.parent.parent / "refs" / "main").write_text(other)
  with pytest.raises(FileExistsError, match="the model behind the same path.* changed"):
    _run(cfg)
  assert "reusing" not in _run(cfg, overwrite=True)[1]


@pytest.mark.slow
def test_replaced_scores_are_redone_and_a_refusal_writes_nothing(tmp_path, model_dir):
  """Issue 52 item 6. Before: a scores.npz replaced by another model's was reused as intact (and
  --redo analysis then failed after deleting tests.csv and summary.json); a refused analyze
  into another run's folder still wrote .heads_jax_hashes.json there."""
  import shutil
  data = tmp_path / "s.txt"
  data.write_text("\n".join(SENTENCES) + "\n")
  other_model = _tiny_model_dir(tmp_path / "m3", num_heads=2)
  _run(_cfg(other_model, data, tmp_path / "b"))
  cfg = _cfg(model_dir, data, tmp_path / "a")
  _run(cfg)
  shutil.copy(tmp_path / "b" / contract.SCORES_FILE, tmp_path / "a" / contract.SCORES_FILE)
  host, log = _run(cfg, redo="analysis")
  assert "is not the file this analysis wrote" in log
  ours = contract.read_scores(tmp_path / "a")
  assert ours.num_heads != contract.read_scores(tmp_path / "b").num_heads
  assert (tmp_path / "a" / contract.TESTS_CSV).is_file()
  # a refusal (another run's results in --out) writes nothing there
  before = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*"))
  stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*")}
  with pytest.raises(FileExistsError, match="another run's results"):
    _run(_cfg(model_dir, data, tmp_path / "b"))
  assert sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")) == before
  assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*")}


@pytest.mark.slow
def test_a_moved_analysis_is_reused_from_another_directory(tmp_path, model_dir, monkeypatch):
  """Issue 52 item 1 on a real analysis: moved, and named from its parent folder, it is reused
  (no device pass, no host statistics) and its report's location is the one given now."""
  import shutil
  data = tmp_path / "s.txt"
  data.write_text("\n".join(SENTENCES) + "\n")
  monkeypatch.chdir(tmp_path)
  _run(_cfg(model_dir, data, "runs/a", report=True))
  shutil.move("runs/a", "runs/b")
  monkeypatch.chdir(tmp_path / "runs")
  host, log = _run(_cfg(model_dir, data, "b", report=True))
  assert "reusing the device pass in b" in log and "reusing the analysis in b" in log
  assert str(host["report"]) == "b/report.html" and host["report"].is_file()
