"""GLUE fine-tuning (MRPC, QQP, SST-2, QNLI, MNLI, RTE, CoLA, STS-B, WNLI) with LAMB:
``train_and_evaluate(config, workdir)``.
``task = "squad"`` is SQuAD question answering (``heads_jax.training.squad``).

The config is ``configs/finetune.py`` (one preset per task, the paper's grids, and ``tiny``); the
set-up shared with pre-training is ``heads_jax.training.job.TrainingJob``.

Data (``heads_jax.data.glue_splits``): rows passed in memory (``rows=``), or local GLUE TSV
folders or TFDS ``glue/<task>``. Where a
task has no train split (the shared copy of QNLI has only dev and test; QQP only a 23K-row
``train_subset``), or ``data.holdout_fraction > 0``, the available labelled split is shuffled
with ``data.holdout_seed`` and cut into an evaluation and a training set; the summary and
``workdir/data.json`` say which rows were used. Pairs are encoded ``[CLS] A [SEP] B [SEP]`` with
longest-first truncation to ``data.max_seq_length``. Training batch ``N`` is a function of
``data_seed`` and ``N`` (``EpochBatches``), so resumed runs see the same batches.

Evaluation on the dev/eval set every ``eval_every`` steps and at the end: accuracy for every
classification task, F1 of the positive class (label 1) for MRPC and QQP, Matthews' correlation
for CoLA; STS-B is a regression (one output, mean squared error loss, as transformers'
``num_labels=1``) scored by Pearson's and Spearman's correlations (``glue_batches.task_metrics``).
MNLI evaluates on ``dev_matched`` (``data.eval_split=dev_mismatched`` for the other). The best
evaluation (by ``select_metric``) keeps its parameters in ``workdir/best`` (Orbax); at the end they are exported
to ``workdir/best_model`` (heads_jax model directory, what ``heads-jax analyze --model`` reads)
and ``workdir/best_hf`` (Hugging Face ``BertForSequenceClassification``).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from heads_jax.hub import looks_like_repo_id
from heads_jax.data import glue
from heads_jax.data.glue_batches import EpochBatches, encode_labelled, eval_batches, task_metrics
from heads_jax.data.glue_splits import load_task_splits
from heads_jax.storage import as_path, is_url, local_copy, write_text
from heads_jax.data.tokenizer import TOKENIZER_FILES, load_tokenizer
from heads_jax.errors import UserError
from heads_jax.parallel import shard_batch
from heads_jax.training import configlib, steps
from heads_jax.training.job import TrainingJob, rows_identity


def task_splits(config):
  """``(train, eval, note)`` of ``config.task`` as ``config.data`` says
  (``heads_jax.data.glue_splits.load_task_splits``)."""
  d = config.data
  glue_dir = local_copy(d.glue_dir) if d.source == "tsv" and is_url(d.glue_dir) else d.glue_dir
  return load_task_splits(config.task, source=d.source, glue_dir=glue_dir,
                          tfds_data_dir=d.tfds_data_dir, train_split=d.train_split,
                          eval_split=d.eval_split, holdout_fraction=d.holdout_fraction,
                          holdout_seed=d.holdout_seed, max_examples=d.max_examples,
                          fallback_split=d.fallback_train_split)


def regression_loss(model, batch: dict, *, deterministic: bool):
  """Mean squared error of the one-output head over rows with ``weights`` (default all 1), as
  transformers' sequence classifier with ``num_labels=1``; predictions are the scores ``[b]``."""
  out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
              deterministic=deterministic)
  pred = out["logits"].astype(jnp.float32)[:, 0]                        # [b]
  labels = batch["labels"].astype(jnp.float32)
  w = batch.get("weights")
  w = jnp.ones(labels.shape, jnp.float32) if w is None else w.astype(jnp.float32)
  loss = jnp.sum((pred - labels) ** 2 * w) / jnp.maximum(jnp.sum(w), 1.0)
  return loss, {"loss": loss}, pred


def loss_of(info):
  """The training loss of a GLUE task: `regression_loss` (STS-B) or cross-entropy."""
  return regression_loss if info.is_regression else steps.classification_loss


def _tokenizer_for(config):
  if config.tokenizer:
    return load_tokenizer(local_copy(config.tokenizer))
  init = as_path(config.init_checkpoint) if config.init_checkpoint else None
  if init and init.is_dir() and any((init / f).is_file() for f in TOKENIZER_FILES):
    return load_tokenizer(local_copy(init))
  if config.init_checkpoint and not init.exists() and looks_like_repo_id(str(config.init_checkpoint)):
    return load_tokenizer(str(config.init_checkpoint))  # a hub id: the tokenizer of its cached snapshot
  return load_tokenizer(None)


def check_init_checkpoint(config) -> None:
  """A preset that fine-tunes a pre-trained model (the paper's ``TASK`` and ``squad``, the
  ``cpu_`` ones) refuses to start without ``init_checkpoint`` unless ``from_scratch``: one line
  naming both. The ``tiny`` presets (and configs built in code, no preset) train from random
  weights as they say."""
  name = str(config.get("preset", "")).split(",")[0]
  if config.init_checkpoint or not name or name.startswith("tiny"):
    return
  if name.startswith("cpu_"):
    raise UserError(f"the {name} preset fine-tunes a pretrained model: pass "
                    "--config.init_checkpoint=DIR (e.g. a Hugging Face all-MiniLM-L6-v2 folder)")
  if not config.get("from_scratch", False):
    raise UserError(f"the {name} preset fine-tunes a pre-trained BERT, but no init_checkpoint is "
                    f"given: pass --config.init_checkpoint=DIR (a Hugging Face BERT folder such as "
                    f"bert-base-uncased, a heads_jax model or a pre-training run's checkpoints), "
                    f"or --config.from_scratch=true to fine-tune a randomly initialised "
                    f"{config.model.size} model on purpose")


def train_and_evaluate(config, workdir, rows=None) -> dict:
  """Fine-tunes as ``config`` says, in ``workdir`` (resuming a run found there).

  ``rows``: ``(train, eval, note)`` examples in memory (as `task_splits` returns them; the
  reproduce pipeline's planned rows) instead of those ``config.data`` names.

  Returns a summary: ``best`` (the best evaluation, with its ``step``), ``final_eval``,
  ``history``, ``data`` (where the examples came from), ``exports`` (paths), ``workdir``.
  """
  configlib.check_training_config(config)  # before any data is read or device work done
  check_init_checkpoint(config)
  if config.task == "squad":  # span QA: its own data, loss and evaluation
    from heads_jax.training import squad
    return squad.train_and_evaluate(config, workdir, _tokenizer_for(config))
  job = TrainingJob(config, workdir)
  pid, pcount = job.process_index, job.process_count
  info = glue.task_info(config.task)
  tokenizer = _tokenizer_for(config)
  train_ex, eval_ex, note = rows if rows is not None else task_splits(config)
  job.create_dir()
  job.check_data(rows_identity(train=train_ex, eval=eval_ex))  # a resume on other rows: refused
  if job.is_main:
    write_text(job.dir.data_file, json.dumps(note))
  train_arrays = encode_labelled(train_ex, tokenizer, config.data.max_seq_length)
  eval_arrays = encode_labelled(eval_ex, tokenizer, config.data.max_seq_length)

  model = job.init_model("classification", tokenizer, num_labels=info.num_labels)
  state = job.initial_state(model, init_subtree="bert")
  del model
  train_step = job.train_step(loss_of(info))
  eval_step = job.eval_step(loss_of(info), with_predictions=True)

  best_ckpts, best = job.best_checkpoints(state)
  select = config.select_metric or info.metrics[-1]

  def evaluate(params) -> dict:
    preds, rows = [], []
    losses = []
    for batch, idx in eval_batches(eval_arrays, config.eval_batch_size, job.num_devices,
                                   process_index=pid, process_count=pcount):
      m, p = eval_step(params, shard_batch(batch, job.mesh))
      m = steps.to_host(m)
      if pcount > 1:  # every process gets all predictions, in process order
        p = multihost_utils.process_allgather(p, tiled=True)
        idx = multihost_utils.process_allgather(idx, tiled=True)
      preds.append(np.asarray(jax.device_get(p)))
      rows.append(np.asarray(idx))
      losses.append((float(m["loss"]), float(np.sum(idx >= 0))))
    pred, row = np.concatenate(preds), np.concatenate(rows)
    keep = row >= 0
    out = task_metrics(info, pred[keep], eval_arrays["labels"][row[keep]])
    out["loss"] = sum(l * n for l, n in losses) / max(1.0, sum(n for _, n in losses))
    return out

  last_eval = {}

  def eval_fn(state, step):
    nonlocal best, last_eval
    ev = evaluate(state["params"])
    ev = {k: v for k, v in ev.items() if k in info.metrics or k == "loss"}
    score = ev[select]
    last_eval = dict(ev, step=step)
    if score > best["score"]:
      best = {"score": float(score), "step": int(step), **{k: float(v) for k, v in ev.items()}}
      best_ckpts.save(step, {"params": state["params"]}, {"best": best}, force=True)
    ev["best_" + select] = best["score"]
    return ev

  batches = EpochBatches(train_arrays, config.batch_size, config.data_seed, pid, pcount)
  job.print(f"fine-tuning {info.name} ({note['num_train']} train / {note['num_eval']} eval, "
            f"{note.get('eval_split')}) from {job.origin} at step {job.start_step}/"
            f"{config.num_train_steps}")
  state, history = job.train(state, train_step, batches.iterate(job.start_step),
                             seq_len=config.data.max_seq_length, eval_fn=eval_fn,
                             meta={"task": info.name, "origin": job.origin})
  done = int(steps.to_host(state["step"]))
  exports, best = job.export_best(state, best_ckpts, best, tokenizer,
                                  id2label=dict(enumerate(info.label_names)) or None)
  best_ckpts.close()
  summary = {"best": best, "final_eval": last_eval, "history": history, "data": note,
             "exports": exports, "workdir": str(job.dir), "start_step": job.start_step,
             "final_step": done, "origin": job.origin, "select_metric": select, "state": state}
  if job.is_main:
    write_text(job.dir.summary_file, json.dumps(
        {k: v for k, v in summary.items() if k not in ("history", "state")}, indent=2, default=str))
  job.close()
  return summary
