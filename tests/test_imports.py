"""What a command imports at its start: neither the analysis nor training (TensorBoard writer
included) pulls in torch, where torch is installed (this project's tests install it for the
parity tests, Colab has it): transformers' AutoTokenizer and tensorboardX's writer each import it
(3-5 CPU-seconds at every command's start, 2026-11-29)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys, tempfile
import heads_jax.pipelines.analyze, heads_jax.training.pretrain, heads_jax.training.finetune
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.data.assets import vocab_path
from heads_jax.training import metrics
load_tokenizer(vocab_path())
d = tempfile.mkdtemp()
w = metrics.summary_writer()(d)
w.add_scalar("train/loss", 2.5, 1)
w.close()
import pathlib
event, = pathlib.Path(d).glob("events.out.tfevents*")
assert b"train/loss" in event.read_bytes()
print("torch" in sys.modules)
"""


@pytest.mark.slow
def test_commands_and_the_tensorboard_writer_do_not_import_torch():
  pytest.importorskip("torch")
  r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.split() == ["False"], r.stdout
