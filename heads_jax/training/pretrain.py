"""BERT pre-training (masked LM + next-sentence prediction): ``run(config, workdir)``.

The config is ``configs/pretrain.py`` (see its presets). The run directory holds::

    workdir/config.json        the config used
    workdir/checkpoints/       Orbax checkpoints of the full train state (resume point)
    workdir/metrics.jsonl      train and eval scalars; workdir/tb/ TensorBoard events
    workdir/model/             at the end: heads_jax model directory (BertForPreTraining)
    workdir/hf/                at the end: Hugging Face directory (BertForPreTraining)

Running the same command again resumes from the latest checkpoint and reproduces the
uninterrupted run exactly (data batch N and the dropout keys of step N depend only on the seeds
and N). Phase 2 (sequence length 512) is a second run whose ``init_checkpoint`` is the phase-1
run's ``checkpoints`` folder: it takes the parameters, not the optimizer state.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from heads_jax.data.corpora import make_corpus
from heads_jax.data.pretraining import PretrainingExamples, PretrainingSpec
from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import checkpointing, configlib, loop, metrics as metrics_lib, optimizer, steps

log = logging.getLogger(__name__)


def model_config(config, vocab_size: int):
  from heads_jax.model.config import config_for
  m = config.model
  return config_for(m.size, vocab_size=vocab_size, dtype=m.dtype, hidden_dropout=m.hidden_dropout,
                    attention_dropout=m.attention_dropout,
                    max_position_embeddings=m.max_position_embeddings)


def _weights(text: str):
  text = (text or "").strip()
  return [float(w) for w in text.split(",")] if text else None


def build_examples(config, tokenizer, *, eval_split: bool = False) -> PretrainingExamples:
  d = config.data
  sources = d.eval_sources if (eval_split and d.eval_sources) else d.sources
  corpus = make_corpus(sources, layout=d.layout, split=d.split, data_dir=d.tfds_data_dir or None,
                       text_key=d.text_key, weights=_weights(d.weights))
  spec = PretrainingSpec(max_seq_length=d.max_seq_length, max_predictions=d.max_predictions,
                         masked_lm_prob=d.masked_lm_prob, short_seq_prob=d.short_seq_prob,
                         random_next_prob=d.random_next_prob, whole_word_mask=d.whole_word_mask)
  seed = d.eval_seed if eval_split else config.data_seed
  return PretrainingExamples(corpus, tokenizer, spec, seed=seed)


def make_tx(config):
  o = config.optimizer
  k = max(1, o.accumulate_steps)
  return optimizer.make_optimizer(
      learning_rate=o.learning_rate, warmup_steps=o.warmup_steps,
      total_steps=max(1, config.num_train_steps // k), weight_decay=o.weight_decay, b1=o.b1,
      b2=o.b2, eps=o.eps, clip_norm=o.clip_norm, accumulate_steps=k,
      end_learning_rate=o.end_learning_rate, power=o.power, name=o.name)


def train_and_evaluate(config, workdir) -> dict:
  """Pre-trains as ``config`` says, in ``workdir`` (resuming a run found there).

  Returns a summary: ``history`` (logged train metrics per step), ``eval`` (the last
  evaluation), ``start_step``, ``origin``, ``tokens_per_s`` (mean over the logged intervals
  after the first), ``workdir``.
  """
  steps.maybe_initialize_distributed(config.distributed)
  workdir = Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  is_main = jax.process_index() == 0
  if is_main:
    configlib.save_config(config, workdir / "config.json")
  from heads_jax.data.tokenizer import load_tokenizer
  tokenizer = load_tokenizer(config.tokenizer or None)
  mesh = data_mesh()
  n_dev = mesh.devices.size
  if config.batch_size % n_dev:
    raise ValueError(f"batch_size {config.batch_size} is not divisible by the {n_dev} devices; "
                     f"use a multiple of {n_dev}")
  examples = build_examples(config, tokenizer)
  tx, schedule = make_tx(config)

  init_model = loop.load_init_model(config.init_checkpoint, "pretraining", dtype=config.model.dtype)
  if init_model is None:
    from heads_jax.model.heads import BertForPreTraining
    cfg = model_config(config, tokenizer.vocab_size)
    init_model = BertForPreTraining(cfg, rngs=nnx.Rngs(config.seed))
  cfg = init_model.config
  if cfg.vocab_size != tokenizer.vocab_size:
    raise ValueError(f"model vocabulary ({cfg.vocab_size}) and tokenizer ({tokenizer.vocab_size}) "
                     f"differ: pass the tokenizer of the init checkpoint (config.tokenizer)")
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise ValueError(f"data.max_seq_length {config.data.max_seq_length} exceeds the model's "
                     f"max_position_embeddings {cfg.max_position_embeddings}")

  ckpts = checkpointing.Checkpoints(workdir / "checkpoints",
                                    save_interval_steps=config.checkpoint.every_steps,
                                    max_to_keep=config.checkpoint.keep,
                                    async_save=config.checkpoint.async_save)
  parts, state, start_step, origin = loop.initial_state(
      model=init_model, tx=tx, mesh=mesh, ckpts=ckpts, init_checkpoint=config.init_checkpoint)
  del init_model

  train_step = steps.make_train_step(parts, tx, steps.pretraining_loss, mesh=mesh,
                                     schedule=schedule,
                                     accumulate_steps=config.optimizer.accumulate_steps,
                                     dropout_seed=config.dropout_seed)
  eval_step = steps.make_eval_step(parts, steps.pretraining_loss, mesh=mesh)
  eval_examples = build_examples(config, tokenizer, eval_split=True) if config.eval_batches else None
  pid, pcount = jax.process_index(), jax.process_count()

  unigram = None
  if eval_examples is not None and config.data.unigram_examples > 0:
    unigram = eval_examples.unigram_entropy(config.data.unigram_examples)
    if is_main:
      print(f"unigram baseline of the held-out text: {unigram:.3f} nats per wordpiece (the MLM "
            f"loss of a model without context, from {config.data.unigram_examples} examples)",
            flush=True)

  def eval_fn(state, step):
    if eval_examples is None:
      return {}
    rows = []
    for i in range(config.eval_batches):
      batch = eval_examples.batch(i, config.batch_size, pid, pcount)
      rows.append(steps.to_host(eval_step(state["params"], shard_batch(batch, mesh))))
    out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    if unigram is not None:
      out["unigram_baseline"] = unigram
    return out

  q = config.data.max_seq_length
  n_params = metrics_lib.non_embedding_params(state["params"])
  fpt = metrics_lib.train_flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, q)
  throughput = metrics_lib.Throughput(config.batch_size * q, fpt, n_dev, jax.devices()[0].device_kind,
                                      config.num_train_steps, start_step)
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, tensorboard=config.tensorboard)
  batches = examples.batches(start_step, config.batch_size, process_index=pid, process_count=pcount,
                             prefetch=config.data.prefetch, num_workers=config.data.num_workers)
  if is_main:
    print(f"pre-training {cfg.num_layers}x{cfg.num_heads} hidden {cfg.hidden_size} from {origin} "
          f"at step {start_step}/{config.num_train_steps}; {loop.device_summary()}", flush=True)
  last_eval = {}

  def eval_and_keep(state, step):
    nonlocal last_eval
    last_eval = eval_fn(state, step)
    return last_eval

  try:
    state, history = loop.train_loop(
        state=state, train_step=train_step, batches=iter(batches), mesh=mesh,
        start_step=start_step, total_steps=config.num_train_steps, ckpts=ckpts, writer=writer,
        throughput=throughput, log_every=config.log_every, eval_every=config.eval_every,
        eval_fn=eval_and_keep if config.eval_batches else None,
        meta_fn=lambda s: {"step": s, "preset": config.preset, "origin": origin},
        stop_at_step=config.stop_at_step, print_fn=print if is_main else None)
  finally:
    if hasattr(batches, "close"):
      batches.close()
    ckpts.close()
    writer.close()
  done = int(steps.to_host(state["step"]))
  if config.export and done >= config.num_train_steps and is_main:
    export(parts, state["params"], tokenizer, workdir)
  speeds = [h["tokens_per_s"] for h in history[1:] if "tokens_per_s" in h]
  return {"history": history, "eval": last_eval, "unigram_baseline": unigram,
          "start_step": start_step, "origin": origin,
          "final_step": done, "tokens_per_s": float(np.mean(speeds)) if speeds else None,
          "workdir": str(workdir), "state": state}


def export(parts, params, tokenizer, workdir) -> None:
  """Writes ``workdir/model`` (heads_jax) and ``workdir/hf`` (Hugging Face) from ``params``."""
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.convert import export_hf
  model = steps.merge_model(parts, steps.to_host(params))
  save_model(model, Path(workdir) / "model", tokenizer)
  export_hf(model, tokenizer, Path(workdir) / "hf")
