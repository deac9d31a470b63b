"""Train steps (sharded vs single device, dropout keys), exact resume, two-phase init, metrics,
configs, and the loss of a tiny model falling on real text."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from heads_jax.errors import UserError
from flax import nnx

from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForPreTraining
from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import checkpointing, configlib, job, loop, metrics, optimizer, pretrain, steps


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


def _model(tokenizer, seed=0):
  return BertForPreTraining(config_for("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(seed))


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


V = 512  # a small vocabulary keeps the compile times of the step tests short


def _synthetic_batch(seed, b=16, q=32, p=5):
  rng = np.random.default_rng(seed)
  n = rng.integers(q // 2, q + 1, size=b)
  mask = (np.arange(q)[None] < n[:, None]).astype(np.int32)
  return {"input_ids": rng.integers(1, V, (b, q)).astype(np.int32) * mask,
          "attention_mask": mask,
          "token_type_ids": ((np.arange(q)[None] > n[:, None] // 2) * mask).astype(np.int32),
          "masked_positions": np.sort(rng.integers(1, q // 2, (b, p)), axis=1).astype(np.int32),
          "masked_ids": rng.integers(1, V, (b, p)).astype(np.int32),
          "masked_weights": (rng.random((b, p)) < 0.8).astype(np.float32),
          "next_sentence_label": rng.integers(0, 2, b).astype(np.int32)}


@pytest.fixture(scope="module")
def small_setup():
  # 8-bit dropout masks (pre-training's): drawn per row, so partitioned as the batch
  model = BertForPreTraining(config_for("tiny", vocab_size=V, num_layers=1, dropout_bits=8),
                             rngs=nnx.Rngs(0))
  parts, params = steps.split_model(model)
  tx, sched = optimizer.make_optimizer(learning_rate=1e-2, warmup_steps=1, total_steps=10)
  mesh = data_mesh()
  step8 = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh, schedule=sched,
                                dropout_seed=3)
  return parts, params, tx, sched, mesh, step8


@pytest.mark.slow  # two compilations: ~15 s on an idle 2-core CPU, more when it is shared
def test_sharded_step_equals_single_device(small_setup):
  assert jax.device_count() == 8
  parts, params, tx, sched, mesh8, step8 = small_setup
  mesh1 = data_mesh(jax.devices()[:1])
  step1 = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh1, schedule=sched,
                                dropout_seed=3)
  results = {}
  for n, mesh, step in ((8, mesh8, step8), (1, mesh1, step1)):
    state = steps.place_state(steps.init_train_state(params, tx), mesh)
    losses = []
    for i in range(3):
      state, m = step(state, shard_batch(_synthetic_batch(i), mesh))
      losses.append(float(m["loss"]))
    if n == 8:
      leaf = jax.tree.leaves(state["params"])[0]
      assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated
    results[n] = (losses, _host(state["params"]))
  np.testing.assert_allclose(results[8][0], results[1][0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(results[8][1]), jax.tree.leaves(results[1][1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)
  moved = max(float(np.abs(a - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(results[1][1]), jax.tree.leaves(params)))
  assert moved > 1e-4


@pytest.mark.slow
def test_dropout_keys_depend_on_step_only(small_setup):
  parts, params, tx, _, mesh, step = small_setup
  batch = shard_batch(_synthetic_batch(0), mesh)
  fresh = lambda k: steps.place_state(dict(steps.init_train_state(params, tx), step=jnp.int32(k)),
                                      mesh)
  l0 = float(step(fresh(0), batch)[1]["loss"])
  l0_again = float(step(fresh(0), batch)[1]["loss"])
  l5 = float(step(fresh(5), batch)[1]["loss"])
  eval_step = steps.make_eval_step(parts, steps.pretraining_loss, mesh=mesh)
  l_det = float(eval_step(steps.place_state(params, mesh), batch)["loss"])
  assert l0 == l0_again
  assert l0 != l5 and l0 != l_det  # dropout is on in training, keyed by the step


@pytest.mark.slow
def test_pretraining_loss_by_hand(small_setup):
  """MLM loss = weighted mean NLL at the masked positions, + NSP mean NLL (numpy check)."""
  parts, params, _, _, _, _ = small_setup
  batch = _synthetic_batch(7, b=4)

  @jax.jit
  def run(params, batch):
    model = steps.merge_model(parts, params)
    loss, m = steps.pretraining_loss(model, batch, deterministic=True)
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                masked_positions=batch["masked_positions"])
    return loss, m, out["mlm_logits"], out["nsp_logits"]

  loss, m, mlm_logits, nsp_logits = run(params, batch)
  out = {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits}
  lp = np.asarray(jax.nn.log_softmax(out["mlm_logits"]), np.float64)
  w = batch["masked_weights"]
  nll = -np.take_along_axis(lp, batch["masked_ids"][..., None], -1)[..., 0]
  mlm = (nll * w).sum() / (w.sum() + 1e-5)
  nsp_lp = np.asarray(jax.nn.log_softmax(out["nsp_logits"]), np.float64)
  nsp = -nsp_lp[np.arange(4), batch["next_sentence_label"]].mean()
  np.testing.assert_allclose(float(m["mlm_loss"]), mlm, rtol=1e-5)
  np.testing.assert_allclose(float(loss), mlm + nsp, rtol=1e-5)


def _tiny(steps_=6, **kw):
  c = configlib.load_config("configs/pretrain.py:tiny")
  c.data.max_seq_length, c.data.max_predictions = 32, 5
  c.batch_size = 16
  c.num_train_steps = steps_
  c.optimizer.warmup_steps = 2
  c.checkpoint.every_steps = 2
  c.checkpoint.keep = 2
  c.log_every = 1
  c.eval_batches = 0
  c.export = False
  c.tensorboard = False
  for k, v in kw.items():
    configlib.apply_overrides(c, [f"{k}={v}"])
  return c


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(tmp_path, tokenizer):
  full = pretrain.train_and_evaluate(_tiny(export=True), tmp_path / "a")
  assert [h["step"] for h in full["history"]] == [1, 2, 3, 4, 5, 6]
  kept = sorted(int(p.name) for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == [4, 6]  # saved every 2 steps, the last 2 kept
  # "killed" after step 5: the last checkpoint is step 4 (the forced step-5 save is removed)
  part = pretrain.train_and_evaluate(_tiny(stop_at_step=5), tmp_path / "b")
  assert part["final_step"] == 5
  shutil.rmtree(tmp_path / "b" / "checkpoints" / "5")
  resumed = pretrain.train_and_evaluate(_tiny(), tmp_path / "b")
  assert resumed["start_step"] == 4 and resumed["origin"].startswith("resumed")
  losses_full = {h["step"]: h["loss"] for h in full["history"]}
  losses_res = {h["step"]: h["loss"] for h in resumed["history"]}
  assert [losses_res[s] for s in (5, 6)] == [losses_full[s] for s in (5, 6)]
  assert [h["loss"] for h in part["history"]] == [losses_full[s] for s in range(1, 6)]
  for a, b in zip(jax.tree.leaves(_host(full["state"])), jax.tree.leaves(_host(resumed["state"]))):
    np.testing.assert_array_equal(a, b)
  # the metrics log has one line per step of each run segment
  rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 5, 6]
  # the exported model holds the final parameters
  from heads_jax import load_model
  model, tok = load_model(tmp_path / "a" / "model", head="pretraining")
  _, exported = steps.split_model(model)
  for a, b in zip(jax.tree.leaves(_host(exported)), jax.tree.leaves(_host(full["state"]["params"]))):
    np.testing.assert_array_equal(a, b)
  assert tok.vocab_size == tokenizer.vocab_size

  # phase 2 starts from the phase-1 parameters with a fresh optimizer (step 0)
  c2 = _tiny(2, init_checkpoint=str(tmp_path / "a" / "checkpoints"))
  c2.data.max_seq_length, c2.data.max_predictions = 64, 10
  tx, _ = job.make_tx(c2)
  ck = checkpointing.Checkpoints(tmp_path / "c" / "checkpoints")
  parts, state, start, origin = loop.initial_state(
      model=_model(tokenizer, seed=9), tx=tx, mesh=data_mesh(), ckpts=ck,
      init_checkpoint=c2.init_checkpoint)
  assert start == 0 and origin.startswith("params:") and origin.endswith("@6")
  assert int(state["step"]) == 0
  for a, b in zip(jax.tree.leaves(_host(state["params"])), jax.tree.leaves(_host(full["state"]["params"]))):
    np.testing.assert_array_equal(a, b)
  assert all(not np.any(x) for x in jax.tree.leaves(_host(state["opt_state"])) if x.ndim > 0)
  ck.close()

  # ... and runs at sequence length 64 on a (mocked) TFDS Wikipedia
  tfds = pytest.importorskip("tensorflow_datasets")
  docs = [{"text": f"Article {i} is about topic {i}. It has several sentences. This is one.\n\n"
                   f"Another paragraph of article {i} follows here. It ends now.", "title": str(i)}
          for i in range(20)]
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kw: docs,
                              data_dir=str(tmp_path / "tfds")):
    c2.data.sources = "tfds:wikipedia/20230601.en"
    p2 = pretrain.train_and_evaluate(c2, tmp_path / "p2")
  assert p2["origin"].startswith("params:") and p2["final_step"] == 2
  assert np.isfinite([h["loss"] for h in p2["history"]]).all()


@pytest.mark.slow
def test_loss_falls_on_real_text(tmp_path):
  c = configlib.load_config("configs/pretrain.py:tiny",
                            ["num_train_steps=50", "batch_size=32", "eval_batches=0", "export=False",
                             "log_every=5"])
  s = pretrain.train_and_evaluate(c, tmp_path / "run")
  losses = [h["loss"] for h in s["history"]]
  assert len(losses) == 10
  assert losses[-1] < losses[0] - 0.8, losses
  assert s["history"][-1]["mlm_accuracy"] > 0.03
  assert s["tokens_per_s"] > 0
  assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_flops_and_peaks():
  params = {"embeddings": {"word": {"embedding": np.zeros((10, 4))}},
            "layer": {"kernel": np.zeros((4, 4)), "bias": np.zeros(4)}}
  assert metrics.non_embedding_params(params) == 20
  assert metrics.train_flops_per_token(20, 2, 4, 8) == 6 * 20 + 12 * 2 * 4 * 8
  # BERT-base at 128: 85M non-embedding parameters -> ~0.52 GFLOP per token
  assert abs(metrics.train_flops_per_token(85_000_000, 12, 768, 128) / 1e9 - 0.524) < 0.01
  assert metrics.peak_flops("TPU v3") == 61.5e12
  assert metrics.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert metrics.peak_flops("NVIDIA H100 PCIe") == 756e12
  assert metrics.peak_flops("TPU v5 lite") == 197e12
  assert metrics.peak_flops("cpu") is None
  t = metrics.Throughput(1000, 1e9, 8, "TPU v3", total_steps=100)
  t._t -= 2.0
  out = t.update(10)
  assert abs(out["steps_per_s"] - 5) < 0.1 and abs(out["tokens_per_s"] - 5000) < 100
  assert abs(out["mfu"] - 5000 * 1e9 / (8 * 61.5e12)) < 1e-3 and abs(out["eta_s"] - 18) < 0.5
  line = metrics.progress_line(10, 100, {"loss": 1.5, **out})
  assert "step 10/100" in line and "MFU" in line and "left" in line


def test_metrics_writer(tmp_path):
  w = metrics.MetricsWriter(tmp_path)
  w.write(3, {"loss": np.float32(2.5), "mfu": None})
  w.write(4, {"accuracy": 0.5}, "eval")
  w.close()
  rows = metrics.read_metrics(tmp_path)
  assert rows[0]["step"] == 3 and rows[0]["loss"] == 2.5 and rows[0]["mfu"] is None
  assert metrics.read_metrics(tmp_path, "eval")[0]["accuracy"] == 0.5
  assert list((tmp_path / "tb").glob("events.out.tfevents*"))


def test_configs_and_overrides():
  c = configlib.load_config("configs/pretrain.py:bert_base")
  assert (c.model.size, c.data.max_seq_length, c.num_train_steps) == ("base", 128, 300_000)
  p2 = configlib.load_config("configs/pretrain.py:bert_base_phase2", ["optimizer.learning_rate=1e-4"])
  assert (p2.data.max_seq_length, p2.data.max_predictions, p2.num_train_steps) == (512, 80, 1000)
  assert p2.optimizer.learning_rate == 1e-4
  for preset in ("small", "small_phase2", "tiny", "tiny_phase2"):
    configlib.load_config(f"configs/pretrain.py:{preset}")
  ft = configlib.load_config("configs/finetune.py:qnli,bs=128,lr=2e-4")
  assert (ft.task, ft.batch_size, ft.optimizer.learning_rate, ft.optimizer.warmup_steps) == \
      ("qnli", 128, 2e-4, 10_000)
  cpu = configlib.load_config("configs/finetune.py:cpu_sst2,init=/m")
  assert (cpu.model.dtype, cpu.data.max_seq_length, cpu.init_checkpoint) == ("float32", 64, "/m")
  assert cpu.optimizer.warmup_steps == cpu.num_train_steps // 10
  with pytest.raises(ValueError, match="unknown task"):
    configlib.load_config("configs/finetune.py:cpu_nope")  # (CoLA is a task since issue 24)
  with pytest.raises(UserError, match="no field 'model.nope'"):
    configlib.load_config("configs/pretrain.py:tiny", ["model.nope=1"])
  with pytest.raises(UserError, match="batch_size must be of type int"):
    configlib.load_config("configs/pretrain.py:tiny", ["batch_size=abc"])
  with pytest.raises(ValueError, match="unknown"):
    configlib.load_config("configs/pretrain.py:huge")
  c = configlib.load_config("configs/pretrain.py:tiny", ["data.sources=123", "model.dtype=bfloat16",
                                                          "optimizer.learning_rate=1"])
  assert c.data.sources == "123" and c.optimizer.learning_rate == 1.0
  rest, ov = configlib.split_config_overrides(["--workdir", "w", "--config.batch_size=8",
                                               "--config.model.size", "mini"])
  assert rest == ["--workdir", "w"] and ov == ["config.batch_size=8", "config.model.size=mini"]
  import argparse
  from heads_jax.train import pretrain as pretrain_entry
  parser = argparse.ArgumentParser()
  pretrain_entry.add_args(parser)
  args = parser.parse_args(["--workdir", "w", "--set", "batch_size=8", "--set", "log_every=3"])
  cfg = configlib.load_config(args.config, args.overrides)
  assert cfg.batch_size == 8 and cfg.log_every == 3 and cfg.model.size == "tiny"


@pytest.mark.parametrize("bad_step, key, last_good, deleted", [
    (5, "loss", 2, (4,)),       # the loss of step 5 comes from the state saved at step 4
    (4, "grad_norm", 2, ()),    # the update of step 4 is bad: step 4 is never saved
    (2, "loss", None, ()),      # the state of step 1 was never saved; nothing good is left
])
def test_non_finite_loss_keeps_only_good_checkpoints(tmp_path, bad_step, key, last_good, deleted):
  # A fake step (no model): the state counts steps, the metrics are given per step. Logging every
  # 10 steps, so the check before each save (every 2 steps) is what stops the run.
  def train_step(state, batch):
    k = int(state["step"]) + 1
    m = {"loss": 1.0, "grad_norm": 1.0}
    if k == bad_step:
      m[key] = float("nan")
    return {"step": np.int32(k), "w": state["w"] + 1}, m

  ckpts = checkpointing.Checkpoints(tmp_path / "ck", save_interval_steps=2, max_to_keep=3,
                                    async_save=False)
  batches = iter(lambda: {"x": np.zeros(8, np.float32)}, None)
  with pytest.raises(loop.NonFiniteLoss) as e:
    loop.train_loop(state={"step": np.int32(0), "w": np.zeros(3, np.float32)},
                    train_step=train_step, batches=batches, mesh=data_mesh(), start_step=0,
                    total_steps=10, ckpts=ckpts, writer=None, throughput=None, log_every=10,
                    print_fn=None)
  assert e.value.step == bad_step and e.value.last_good == last_good
  kept = [last_good] if last_good is not None else []
  assert ckpts.all_steps() == kept
  assert ("moved the checkpoint(s) of step 4 that led to it" in str(e.value)) == bool(deleted)
  assert sorted(int(p.name) for p in (tmp_path / "nonfinite_checkpoints").glob("*")) == list(deleted)
  assert isinstance(e.value, UserError)
  ckpts.close()
