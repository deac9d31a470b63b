"""CLI paths without other tests: ``convert`` both ways and its refusals, ``compare`` errors,
pre-training/fine-tuning config errors, ``--debug``, Ctrl-C, ``--out`` on a file, bad ``--tau``
and ``--roles``. Errors a user can fix: exit 2, one line on stderr, nothing written."""

import json

import jax
import numpy as np
import pytest

from heads_jax import cli
from heads_jax.errors import UserError
from heads_jax.model.convert import flat_params
from heads_jax.model.loading import load_model
from tests.test_cli_errors import _tiny_model_dir
from tests.hoststats.test_compare import _write_run


def _run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.err.strip(), captured.out


def _one_line(code, err):
  assert code == 2 and len(err.splitlines()) == 1, (code, err)
  assert "Traceback" not in err
  return err


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return _tiny_model_dir(tmp_path_factory.mktemp("model") / "m")


def test_convert_both_directions_and_refusals(capsys, tmp_path, model_dir):
  # heads_jax -> Hugging Face (the source has heads_jax.json)
  code, err, out = _run(capsys, "convert", model_dir, tmp_path / "hf")
  assert code == 0 and "wrote Hugging Face BertModel (2 layers x 4 heads)" in out, (err, out)
  assert not (tmp_path / "hf" / "heads_jax.json").exists()
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["model_type"] == "bert" and config["num_hidden_layers"] == 2
  # Hugging Face -> heads_jax (no heads_jax.json): the same parameters come back
  code, err, out = _run(capsys, "convert", tmp_path / "hf", tmp_path / "back")
  assert code == 0 and "wrote heads_jax BertModel" in out, (err, out)
  assert (tmp_path / "back" / "heads_jax.json").is_file()
  original, _ = load_model(model_dir)
  again, _ = load_model(tmp_path / "back")
  a, b = flat_params(original), flat_params(again)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(b[k]), np.asarray(a[k]), err_msg=k)

  # a destination holding files is refused and left as it was; --overwrite replaces it
  stamp = (tmp_path / "hf" / "model.safetensors").stat().st_mtime_ns
  err = _one_line(*_run(capsys, "convert", model_dir, tmp_path / "hf")[:2])
  assert "is not empty" in err and "--overwrite" in err
  assert (tmp_path / "hf" / "model.safetensors").stat().st_mtime_ns == stamp
  code, _, out = _run(capsys, "convert", model_dir, tmp_path / "hf", "--overwrite")
  assert code == 0 and "wrote Hugging Face" in out
  (tmp_path / "file").write_text("keep me")
  err = _one_line(*_run(capsys, "convert", model_dir, tmp_path / "file")[:2])
  assert str(tmp_path / "file") in err and (tmp_path / "file").read_text() == "keep me"
  err = _one_line(*_run(capsys, "convert", tmp_path / "nope", tmp_path / "x")[:2])
  assert "does not exist" in err and not (tmp_path / "x").exists()
  (tmp_path / "empty").mkdir()
  err = _one_line(*_run(capsys, "convert", tmp_path / "empty", tmp_path / "y")[:2])
  assert "neither config.json" in err


def test_compare_errors(capsys, tmp_path):
  before = _write_run(tmp_path / "before", False)
  after = _write_run(tmp_path / "after", True)
  (tmp_path / "empty").mkdir()
  err = _one_line(*_run(capsys, "compare", "--before", tmp_path / "empty", "--after", after,
                        "--out", tmp_path / "c1")[:2])
  assert "no scores.npz" in err and f"heads-jax analyze --out {tmp_path / 'empty'}" in err
  err = _one_line(*_run(capsys, "compare", "--before", before, "--after", tmp_path / "missing",
                        "--out", tmp_path / "c1")[:2])
  assert "no scores.npz" in err
  assert not (tmp_path / "c1").exists()
  # only one of the two models: refused before any comparison is written
  for flag in ("--before-model", "--after-model"):
    err = _one_line(*_run(capsys, "compare", "--before", before, "--after", after,
                          "--out", tmp_path / "c2", flag, tmp_path)[:2])
    assert "needs both --before-model and --after-model" in err
  assert not (tmp_path / "c2").exists()


def test_analyze_flag_errors(capsys, tmp_path, model_dir):
  base = ["analyze", "--model", model_dir, "--data", "ud-ewt", "--max-examples", "4", "--no-report"]
  (tmp_path / "file").write_text("x")
  err = _one_line(*_run(capsys, *base, "--out", tmp_path / "file")[:2])
  assert "is a file" in err and (tmp_path / "file").read_text() == "x"
  err = _one_line(*_run(capsys, *base, "--out", tmp_path / "o", "--roles", "local,bogus")[:2])
  assert "unknown roles ['bogus']" in err and "syntactic" in err
  assert not (tmp_path / "o").exists()
  # argparse's own errors: usage, then the message; exit 2
  with pytest.raises(SystemExit) as e:
    cli.main([str(a) for a in base] + ["--out", str(tmp_path / "o"), "--tau", "abc"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[0].startswith("usage: heads-jax analyze")
  assert err[-1] == "heads-jax analyze: error: argument --tau: must be a number or 'auto', got 'abc'"
  assert not (tmp_path / "o").exists()


def test_debug_shows_the_exception_and_ctrl_c_exits_130(capsys, monkeypatch, tmp_path, model_dir):
  base = ["analyze", "--model", model_dir, "--data", "ud-ewt", "--out", tmp_path / "o"]
  with pytest.raises(UserError, match="unknown roles"):
    cli.main([str(a) for a in base] + ["--roles", "bogus", "--debug"])
  import heads_jax.pipelines.analyze as entry  # the entry module imports it when it runs

  def boom(*a, **k):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory")
  monkeypatch.setattr(entry, "run_analysis", boom)
  with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
    cli.main([str(a) for a in base] + ["--debug"])

  def interrupted(*a, **k):
    raise KeyboardInterrupt
  monkeypatch.setattr(entry, "run_analysis", interrupted)
  capsys.readouterr()
  code, err, _ = _run(capsys, *base)
  assert code == 130 and err == "heads-jax analyze: interrupted"

  def crash(*a, **k):
    raise RuntimeError("a bug")
  monkeypatch.setattr(entry, "run_analysis", crash)
  with pytest.raises(RuntimeError, match="a bug"):   # not a user error: the traceback stays
    cli.main([str(a) for a in base])


PRETRAIN = ["pretrain", "--config", "configs/pretrain.py:tiny"]


def test_pretraining_config_errors(capsys, tmp_path):
  assert jax.device_count() == 8
  err = _one_line(*_run(capsys, *PRETRAIN, "--workdir", tmp_path / "w1", "--config.batch_size=12")[:2])
  assert "batch_size 12 is not divisible by the 8 devices" in err and "multiple of 8" in err
  assert not (tmp_path / "w1").exists()
  small_vocab = _tiny_model_dir(tmp_path / "v97", vocab_size=97)
  err = _one_line(*_run(capsys, *PRETRAIN, "--workdir", tmp_path / "w2",
                        f"--config.init_checkpoint={small_vocab}")[:2])
  assert "model vocabulary (97) and tokenizer (30522) differ" in err and "config.tokenizer" in err
  assert not (tmp_path / "w2" / "checkpoints").exists()
  short = _tiny_model_dir(tmp_path / "p32", max_position_embeddings=32)
  err = _one_line(*_run(capsys, *PRETRAIN, "--workdir", tmp_path / "w3",
                        f"--config.init_checkpoint={short}")[:2])
  assert "data.max_seq_length 64 exceeds the model's max_position_embeddings 32" in err
  err = _one_line(*_run(capsys, *PRETRAIN, "--workdir", tmp_path / "w4",
                        "--config.model.max_position_embeddings=32")[:2])
  assert "data.max_seq_length 64 exceeds the model's max_position_embeddings 32" in err
  err = _one_line(*_run(capsys, *PRETRAIN, "--workdir", tmp_path / "w5", "--config.batch_size=abc")[:2])
  assert "batch_size" in err


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_missing_init_checkpoint(capsys, tmp_path, command):
  preset = "configs/pretrain.py:tiny" if command == "pretrain" else "configs/finetune.py:tiny"
  err = _one_line(*_run(capsys, command, "--config", preset, "--workdir", tmp_path / "w",
                        f"--config.init_checkpoint={tmp_path / 'nope'}")[:2])
  assert f"init_checkpoint {tmp_path / 'nope'} does not exist" in err
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_convert_overwrite_replaces_every_file_or_refuses(capsys, tmp_path, model_dir,
                                                          monkeypatch):
  """Issue 52 item 6: --overwrite over another heads_jax model leaves none of its files (before:
  exit 0 with the old heads_jax.json and params.safetensors kept, the new tokenizer beside
  them); a folder that is not a model's is refused; a full disk is one line and leaves the
  destination as it was."""
  from safetensors import SafetensorError
  from heads_jax.model import convert
  other = _tiny_model_dir(tmp_path / "other", num_layers=1)
  (tmp_path / "other" / "stale.txt").write_text("an earlier model's file")
  hf = tmp_path / "hf"
  assert _run(capsys, "convert", model_dir, hf)[0] == 0
  code, err, out = _run(capsys, "convert", hf, other, "--overwrite")
  assert code == 0, err
  assert not (other / "stale.txt").exists()
  again, _ = load_model(other)
  assert again.config.num_layers == load_model(model_dir)[0].config.num_layers == 2
  # a run's or an unknown folder is never replaced
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "mine.txt").write_text("keep me")
  err = _one_line(*_run(capsys, "convert", hf, tmp_path / "notes", "--overwrite")[:2])
  assert "not a model's" in err and (tmp_path / "notes" / "mine.txt").read_text() == "keep me"
  # a full disk while writing: one line, the destination as it was, no temporary folder left
  before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
  for failure in (OSError(28, "No space left on device"),
                  SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                                  "StorageFull, message: \"No space left on device\" })")):
    monkeypatch.setattr(convert, "save_file", lambda *a, f=failure, **kw: (_ for _ in ()).throw(f))
    err = _one_line(*_run(capsys, "convert", model_dir, tmp_path / "new")[:2])
    assert "disk is full" in err and not (tmp_path / "new").exists()
    from heads_jax.model import checkpoint
    monkeypatch.setattr(checkpoint, "save_file", lambda *a, f=failure, **kw: (_ for _ in ()).throw(f))
    err = _one_line(*_run(capsys, "convert", hf, other, "--overwrite")[:2])
    assert "disk is full" in err
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before
    assert not list(tmp_path.glob(".*converting*"))


@pytest.mark.slow
def test_a_quoted_number_and_a_damaged_tokenizer_file_are_one_line_naming_them(capsys, tmp_path):
  """Issue 52 item 6. Before: a quoted number in a ModernBERT config.json ended in a TypeError
  traceback; a damaged tokenizer_config.json said "Expecting value: line 1 column 19" without
  naming the file."""
  import shutil
  from tests.family_models import save_family_dir
  src = tmp_path / "modernbert"
  save_family_dir("modernbert", src)
  capsys.readouterr()   # the writer's progress bar
  bad = tmp_path / "quoted"
  shutil.copytree(src, bad)
  config = json.loads((bad / "config.json").read_text())
  config["num_attention_heads"] = str(config["num_attention_heads"])
  (bad / "config.json").write_text(json.dumps(config))
  err = _one_line(*_run(capsys, "convert", bad, tmp_path / "out1")[:2])
  assert "num_attention_heads" in err and "not a number" in err and str(bad) in err
  damaged = tmp_path / "damaged"
  shutil.copytree(src, damaged)
  (damaged / "tokenizer_config.json").write_text('{"do_lower_case": }')
  err = _one_line(*_run(capsys, "convert", damaged, tmp_path / "out2")[:2])
  assert str(damaged / "tokenizer_config.json") in err
  assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def _tiny_models_run(capsys, tmp_path, families):
  for family in families:
    code, err, out = _run(capsys, "tiny-model", "--family", family, tmp_path / family)
    assert code == 0 and f"tiny random {family} model" in out, err
    model, tok = load_model(tmp_path / family)
    assert model.config.family == family and model.config.num_heads == 4
    enc = tok(["the cat sat on the mat ."], return_tensors="np")
    hidden = model(enc["input_ids"], attention_mask=enc["attention_mask"])
    assert np.isfinite(np.asarray(jax.tree.leaves(hidden)[0])).all()


@pytest.mark.slow
def test_tiny_models_of_the_own_families_load_and_run(capsys, tmp_path):
  """Issue 52 item 5: `heads-jax tiny-model --family F OUT` writes a model that loads as its
  family's encoder and runs (the offline way to try ModernBERT and DeBERTa-v3); a non-empty OUT
  is refused before anything is written."""
  _tiny_models_run(capsys, tmp_path, ("modernbert", "deberta-v2"))
  err = _one_line(*_run(capsys, "tiny-model", "--family", "modernbert", tmp_path / "modernbert")[:2])
  assert "not an empty directory" in err


@pytest.mark.slow
def test_tiny_models_of_every_family_and_an_analysis(capsys, tmp_path):
  """Every family's tiny model loads and runs; the README's offline ModernBERT command (the tiny
  model, then `analyze` on it) writes its tests."""
  from heads_jax.model.config import ALL_FAMILIES
  from heads_jax.model.tiny import TINY_FAMILIES
  assert set(TINY_FAMILIES) == set(ALL_FAMILIES)
  _tiny_models_run(capsys, tmp_path, TINY_FAMILIES)
  code, err, out = _run(capsys, "analyze", "--model", tmp_path / "modernbert", "--data", "ud-ewt",
                        "--max-examples", "8", "--no-report", "--out", tmp_path / "a")
  assert code == 0, err
  assert (tmp_path / "a" / "tests.csv").is_file()
