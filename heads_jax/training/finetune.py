"""GLUE fine-tuning (MRPC, QQP, SST-2, QNLI) with LAMB: ``run(config, workdir)``.

The config is ``configs/finetune.py`` (one preset per task, the paper's grids, and ``tiny``).

Data: local GLUE TSV folders (``heads_jax.data.glue.load_glue_tsv``) or TFDS ``glue/<task>``
(``load_glue_tfds``). Where a task has no train split (the shared copy of QNLI has only dev and
test; QQP only a 23K-row ``train_subset``), or ``data.holdout_fraction > 0``, the available
labelled split is shuffled with ``data.holdout_seed`` and cut: the first
``round(holdout_fraction * n)`` rows (default 10%) become the evaluation set, the rest the
training set; the summary and ``workdir/data.json`` say which rows were used. Pairs are encoded
``[CLS] A [SEP] B [SEP]`` with longest-first truncation to ``data.max_seq_length``.

Training batch ``N`` holds the examples at positions ``N * B .. N * B + B - 1`` of the endless
sequence of epochs, each epoch a permutation drawn from ``(data_seed, epoch)``: a function of the
seed and ``N``, so resumed runs see the same batches.

Evaluation on the dev/eval set every ``eval_every`` steps and at the end: accuracy for every
task, F1 of the positive class (label 1) for MRPC and QQP. The best evaluation (by
``select_metric``) keeps its parameters in ``workdir/best`` (Orbax); at the end they are exported
to ``workdir/best_model`` (heads_jax model directory, what ``heads-jax analyze --model`` reads)
and ``workdir/best_hf`` (Hugging Face ``BertForSequenceClassification``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from heads_jax.parallel import data_mesh, shard_batch
from heads_jax.training import checkpointing, configlib, loop, metrics as metrics_lib, optimizer, steps

log = logging.getLogger(__name__)

_FALLBACK_TRAIN_SPLITS = ("train", "train_subset", "dev")


# ------------------------------------------------------------------------------------------------
# Data

def load_task_examples(config):
  """``(train, eval, note)``: lists of ``GlueExample`` and a dict describing where they came from."""
  from heads_jax.data import glue
  d = config.data
  info = glue.task_info(config.task)
  note = {"task": info.name, "source": d.source}

  def load(split):
    if d.source == "tfds":
      return glue.load_glue_tfds(info.name, split, data_dir=d.tfds_data_dir or None,
                                 max_examples=d.max_examples or None)
    if d.source == "tsv":
      return glue.load_glue_tsv(d.glue_dir, info.name, split, max_examples=d.max_examples or None)
    raise ValueError(f"data.source must be 'tsv' or 'tfds', got {d.source!r}")

  train_split = d.train_split
  try:
    train = load(train_split)
  except (FileNotFoundError, ValueError) as e:
    if d.source != "tsv":
      raise
    train = None
    for alt in _FALLBACK_TRAIN_SPLITS:
      if alt == train_split:
        continue
      try:
        train = load(alt)
      except FileNotFoundError:
        continue
      log.warning("GLUE %s has no %s split in %s (%s); training on a split of %s", info.name,
                  train_split, d.glue_dir, e, alt)
      train_split = alt
      break
    if train is None:
      raise
  holdout = d.holdout_fraction
  if train_split != d.train_split and holdout <= 0:
    holdout = 0.1
  note["train_split"] = train_split
  if holdout > 0:
    n = len(train)
    order = np.random.default_rng(d.holdout_seed).permutation(n)
    k = int(round(holdout * n))
    if k == 0 or k == n:
      raise ValueError(f"holdout_fraction {holdout} leaves no train or eval rows of {n}")
    eval_rows = sorted(order[:k].tolist())
    train_rows = sorted(order[k:].tolist())
    ev = [train[i] for i in eval_rows]
    train = [train[i] for i in train_rows]
    note.update(eval_split=f"holdout of {train_split}", holdout_fraction=holdout,
                holdout_seed=d.holdout_seed, eval_idx=[e.idx for e in ev])
  else:
    ev = load(d.eval_split)
    note["eval_split"] = d.eval_split
  for name, rows in (("train", train), ("eval", ev)):
    if not rows:
      raise ValueError(f"GLUE {info.name}: the {name} set is empty")
    if any(e.label is None for e in rows):
      raise ValueError(f"GLUE {info.name}: the {name} set has unlabelled rows (a test split?); "
                       f"use the train/dev splits")
  note.update(num_train=len(train), num_eval=len(ev))
  return train, ev, note


def encode_examples(examples, tokenizer, max_seq_length: int) -> dict:
  """``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]`` and ``labels`` ``[n]``."""
  a = [e.text_a for e in examples]
  b = [e.text_b for e in examples] if examples[0].text_b is not None else None
  enc = tokenizer(a, b, truncation="longest_first" if b is not None else True,
                  max_length=max_seq_length, padding="max_length", return_tensors="np")
  out = {k: np.asarray(enc[k], np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
  out["labels"] = np.asarray([e.label for e in examples], np.int32)
  return out


class EpochBatches:
  """Training batches of encoded arrays; batch ``N`` is a function of ``(seed, N)``."""

  def __init__(self, arrays: dict, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1):
    if batch_size % process_count:
      raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
    self.arrays, self.batch_size, self.seed = arrays, batch_size, seed
    self.n = len(arrays["labels"])
    self.local = batch_size // process_count
    self.offset = process_index * self.local
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 4:
        self._perms.clear()
      self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
    return self._perms[epoch]

  def rows(self, step: int) -> np.ndarray:
    first = step * self.batch_size + self.offset
    idx = np.arange(first, first + self.local)
    return np.array([self._perm(int(i // self.n))[i % self.n] for i in idx])

  def batch(self, step: int) -> dict:
    return {k: v[self.rows(step)] for k, v in self.arrays.items()}

  def iterate(self, start_step: int):
    step = start_step
    while True:
      yield self.batch(step)
      step += 1


def eval_batches(arrays: dict, batch_size: int, num_devices: int, process_index: int = 0,
                 process_count: int = 1):
  """Evaluation batches covering every row once; rows padded to the batch size get weight 0.
  Yields ``(batch, rows)`` with ``rows`` the global row index of each of this process's rows
  (-1 on padding)."""
  n = len(arrays["labels"])
  b = -(-batch_size // (num_devices * 1)) * num_devices
  local = b // process_count
  for start in range(0, n, b):
    idx = np.arange(start + process_index * local, start + (process_index + 1) * local)
    real = idx < n
    take = np.where(real, idx, 0)
    batch = {k: v[take] for k, v in arrays.items()}
    batch["attention_mask"] = batch["attention_mask"] * real[:, None].astype(np.int32)
    batch["weights"] = real.astype(np.float32)
    yield batch, np.where(real, idx, -1)


def classification_metrics(pred: np.ndarray, labels: np.ndarray) -> dict:
  """Accuracy and (positive class 1) precision, recall, F1."""
  pred, labels = np.asarray(pred), np.asarray(labels)
  acc = float(np.mean(pred == labels)) if len(labels) else float("nan")
  tp = float(np.sum((pred == 1) & (labels == 1)))
  fp = float(np.sum((pred == 1) & (labels != 1)))
  fn = float(np.sum((pred != 1) & (labels == 1)))
  precision = tp / (tp + fp) if tp + fp else 0.0
  recall = tp / (tp + fn) if tp + fn else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"accuracy": acc, "f1": f1, "precision": precision, "recall": recall}


# ------------------------------------------------------------------------------------------------
# Run

def make_tx(config):
  o = config.optimizer
  return optimizer.make_optimizer(
      learning_rate=o.learning_rate, warmup_steps=o.warmup_steps,
      total_steps=max(1, config.num_train_steps // max(1, o.accumulate_steps)),
      weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, eps=o.eps, clip_norm=o.clip_norm,
      accumulate_steps=max(1, o.accumulate_steps), end_learning_rate=o.end_learning_rate,
      power=o.power, name=o.name)


def _tokenizer_for(config):
  from heads_jax.data.tokenizer import load_tokenizer
  if config.tokenizer:
    return load_tokenizer(config.tokenizer)
  init = Path(config.init_checkpoint) if config.init_checkpoint else None
  if init and init.is_dir() and any((init / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
    return load_tokenizer(init)
  return load_tokenizer(None)


def train_and_evaluate(config, workdir) -> dict:
  """Fine-tunes as ``config`` says, in ``workdir`` (resuming a run found there).

  Returns a summary: ``best`` (the best evaluation, with its ``step``), ``final_eval``,
  ``history``, ``data`` (where the examples came from), ``exports`` (paths), ``workdir``.
  """
  from heads_jax.data import glue
  from heads_jax.errors import UserError
  if str(config.preset).startswith("cpu_") and not config.init_checkpoint:
    raise UserError(f"the {config.preset.split(',')[0]} preset fine-tunes a pretrained model: pass "
                    "--config.init_checkpoint=DIR (e.g. a Hugging Face all-MiniLM-L6-v2 folder)")
  steps.maybe_initialize_distributed(config.distributed)
  workdir = Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  is_main = jax.process_index() == 0
  pid, pcount = jax.process_index(), jax.process_count()
  info = glue.task_info(config.task)
  tokenizer = _tokenizer_for(config)
  train_ex, eval_ex, note = load_task_examples(config)
  if is_main:
    configlib.save_config(config, workdir / "config.json")
    (workdir / "data.json").write_text(json.dumps(note))
  train_arrays = encode_examples(train_ex, tokenizer, config.data.max_seq_length)
  eval_arrays = encode_examples(eval_ex, tokenizer, config.data.max_seq_length)
  mesh = data_mesh()
  n_dev = mesh.devices.size
  if config.batch_size % n_dev:
    raise ValueError(f"batch_size {config.batch_size} is not divisible by the {n_dev} devices")
  tx, schedule = make_tx(config)

  num_labels = info.num_labels
  model = loop.load_init_model(config.init_checkpoint, "classification", num_labels=num_labels,
                               dtype=config.model.dtype)
  if model is None:
    from heads_jax.model.config import config_for
    from heads_jax.model.heads import BertForSequenceClassification
    m = config.model
    cfg = config_for(m.size, vocab_size=tokenizer.vocab_size, dtype=m.dtype,
                     hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
                     max_position_embeddings=m.max_position_embeddings)
    model = BertForSequenceClassification(cfg, num_labels, rngs=nnx.Rngs(config.seed))
  cfg = model.config
  if cfg.vocab_size != tokenizer.vocab_size:
    raise ValueError(f"model vocabulary ({cfg.vocab_size}) and tokenizer ({tokenizer.vocab_size}) "
                     f"differ: set config.tokenizer to the model's tokenizer")

  ckpts = checkpointing.Checkpoints(workdir / "checkpoints",
                                    save_interval_steps=config.checkpoint.every_steps,
                                    max_to_keep=config.checkpoint.keep,
                                    async_save=config.checkpoint.async_save)
  parts, state, start_step, origin = loop.initial_state(
      model=model, tx=tx, mesh=mesh, ckpts=ckpts, init_checkpoint=config.init_checkpoint,
      init_subtree="bert")
  del model
  train_step = steps.make_train_step(parts, tx, steps.classification_loss, mesh=mesh,
                                     schedule=schedule,
                                     accumulate_steps=config.optimizer.accumulate_steps,
                                     dropout_seed=config.dropout_seed)
  eval_step = steps.make_eval_step(parts, steps.classification_loss, mesh=mesh,
                                   with_predictions=True)

  best_ckpts = checkpointing.Checkpoints(workdir / "best", save_interval_steps=1, max_to_keep=1,
                                         async_save=False)
  best = {"score": -np.inf}
  if best_ckpts.latest_step() is not None:
    rep = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                      sharding=x.sharding), state["params"])
    _, meta = best_ckpts.restore({"params": rep})
    best = meta.get("best", best)
  select = config.select_metric or info.metrics[-1]

  def evaluate(params) -> dict:
    preds, rows = [], []
    losses = []
    for batch, idx in eval_batches(eval_arrays, config.eval_batch_size, n_dev, pid, pcount):
      m, p = eval_step(params, shard_batch(batch, mesh))
      m = steps.to_host(m)
      if pcount > 1:  # every process gets all predictions, in process order
        from jax.experimental import multihost_utils
        p = multihost_utils.process_allgather(p, tiled=True)
        idx = multihost_utils.process_allgather(idx, tiled=True)
      preds.append(np.asarray(jax.device_get(p)))
      rows.append(np.asarray(idx))
      losses.append((float(m["loss"]), float(np.sum(idx >= 0))))
    pred, row = np.concatenate(preds), np.concatenate(rows)
    keep = row >= 0
    out = classification_metrics(pred[keep], eval_arrays["labels"][row[keep]])
    out["loss"] = sum(l * n for l, n in losses) / max(1.0, sum(n for _, n in losses))
    return out

  last_eval = {}

  def eval_fn(state, step):
    nonlocal best, last_eval
    ev = evaluate(state["params"])
    ev = {k: v for k, v in ev.items() if k in ("accuracy", "f1", "loss") and
          (k != "f1" or "f1" in info.metrics)}
    score = ev[select]
    last_eval = dict(ev, step=step)
    if score > best["score"]:
      best = {"score": float(score), "step": int(step), **{k: float(v) for k, v in ev.items()}}
      best_ckpts.save(step, {"params": state["params"]}, {"best": best}, force=True)
    ev["best_" + select] = best["score"]
    return ev

  q = config.data.max_seq_length
  n_params = metrics_lib.non_embedding_params(state["params"])
  fpt = metrics_lib.train_flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, q)
  throughput = metrics_lib.Throughput(config.batch_size * q, fpt, n_dev, jax.devices()[0].device_kind,
                                      config.num_train_steps, start_step)
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, tensorboard=config.tensorboard)
  batches = EpochBatches(train_arrays, config.batch_size, config.data_seed, pid, pcount)
  if is_main:
    print(f"fine-tuning {info.name} ({note['num_train']} train / {note['num_eval']} eval, "
          f"{note.get('eval_split')}) from {origin} at step {start_step}/{config.num_train_steps}",
          flush=True)
  try:
    state, history = loop.train_loop(
        state=state, train_step=train_step, batches=batches.iterate(start_step), mesh=mesh,
        start_step=start_step, total_steps=config.num_train_steps, ckpts=ckpts, writer=writer,
        throughput=throughput, log_every=config.log_every, eval_every=config.eval_every,
        eval_fn=eval_fn, meta_fn=lambda s: {"step": s, "task": info.name, "origin": origin},
        stop_at_step=config.stop_at_step, print_fn=print if is_main else None)
  finally:
    ckpts.close()
    writer.close()
  done = int(steps.to_host(state["step"]))
  exports = {}
  if done >= config.num_train_steps and config.export:
    params = state["params"]
    if best_ckpts.latest_step() is not None:
      rep = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                         params)
      restored, meta = best_ckpts.restore({"params": rep})
      params, best = restored["params"], meta.get("best", best)
    if is_main:
      exports = export(parts, params, tokenizer, workdir, info)
  best_ckpts.close()
  summary = {"best": best, "final_eval": last_eval, "history": history, "data": note,
             "exports": exports, "workdir": str(workdir), "start_step": start_step,
             "final_step": done, "origin": origin, "select_metric": select, "state": state}
  if is_main:
    (workdir / "summary.json").write_text(json.dumps(
        {k: v for k, v in summary.items() if k not in ("history", "state")}, indent=2, default=str))
  return summary


def export(parts, params, tokenizer, workdir, info) -> dict:
  """Writes the model with ``params`` to ``workdir/best_model`` and ``workdir/best_hf``."""
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.convert import export_hf
  model = steps.merge_model(parts, steps.to_host(params))
  id2label = dict(enumerate(info.label_names))
  out = {"heads_jax": str(save_model(model, Path(workdir) / "best_model", tokenizer,
                                     id2label=id2label)),
         "hf": str(export_hf(model, tokenizer, Path(workdir) / "best_hf", id2label=id2label))}
  return out
