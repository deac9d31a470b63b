"""SQuAD fine-tuning with LAMB (``config.task == "squad"``; ``heads_jax.training.finetune``
hands such a config here) and the SQuAD evaluation of a span model.

Data (``config.squad``): the official JSON (``source = "json"``: ``train_file``,
``eval_file``; ``eval_titles`` holds those articles of ``train_file`` out as the evaluation set
instead) or TFDS ``squad/<tfds_config>`` (``source = "tfds"``, splits ``data.train_split`` /
``data.eval_split``); ``version`` ``v1`` (answerable questions) or ``v2``
(``heads_jax.data.squad``). Windows as BERT's ``run_squad.py`` (``max_seq_length``
``data.max_seq_length``, ``doc_stride``, ``max_query_length``). Training batch ``N`` is a
function of ``data_seed`` and ``N`` (``EpochBatches`` over the training windows), so resumed
runs see the same batches.

Loss: the mean of the start and end cross-entropies over the window's positions (as
``run_squad.py``; an answer outside the window or an unanswerable question points at position 0).

Evaluation every ``eval_every`` steps and at the end: the n-best answer of
each question over its windows and the official exact match / F1 (``heads_jax.data.squad_eval``),
written as ``workdir/eval/step_NNNNNNN/{predictions.json, eval.json}``. The best evaluation (by
``select_metric``, default ``f1``) keeps its parameters in ``workdir/best``, exported at the end
to ``workdir/best_model`` (heads_jax) and ``workdir/best_hf`` (Hugging Face
``*ForQuestionAnswering``), as for GLUE.

``evaluate_model`` scores any span model (optionally with encoder keywords such as a head gate)
the same way, writing ``predictions.json`` beside ``eval.json``.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from heads_jax.data import squad as sq
from heads_jax.data import squad_eval
from heads_jax.data.glue_batches import EpochBatches
from heads_jax.errors import UserError
from heads_jax.parallel import shard_batch
from heads_jax.storage import local_copy, staged_output
from heads_jax.training import steps
from heads_jax.training.job import TrainingJob, rows_identity

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def span_loss(model, batch: dict, *, deterministic: bool):
  """``(loss, metrics, logits)``: the mean of the start and end cross-entropies over rows with
  ``weights`` (default all 1); ``logits`` float32 ``[b, k, 2]`` (start, end)."""
  out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
              deterministic=deterministic)
  start, end = out["start_logits"].astype(jnp.float32), out["end_logits"].astype(jnp.float32)
  sp, ep = batch["start_positions"], batch["end_positions"]
  w = batch.get("weights")
  w = jnp.ones(sp.shape, jnp.float32) if w is None else w.astype(jnp.float32)
  nll = 0.5 * (optax.softmax_cross_entropy_with_integer_labels(start, sp)
               + optax.softmax_cross_entropy_with_integer_labels(end, ep))
  denom = jnp.maximum(jnp.sum(w), 1.0)
  loss = jnp.sum(nll * w) / denom
  metrics = {"loss": loss,
             "start_accuracy": jnp.sum((jnp.argmax(start, -1) == sp) * w) / denom,
             "end_accuracy": jnp.sum((jnp.argmax(end, -1) == ep) * w) / denom}
  return loss, metrics, jnp.stack([start, end], -1)


class WindowBatches(EpochBatches):
  """``EpochBatches`` over the windows' arrays (which carry span labels, not ``labels``)."""

  def __init__(self, arrays: dict, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1):
    super().__init__(dict(arrays, labels=arrays["start_positions"]), batch_size, seed,
                     process_index, process_count)
    self.arrays = arrays


def window_batches(arrays: dict, batch_size: int, multiple: int, *, process_index: int = 0,
                   process_count: int = 1):
  """Every window once, in order: yields ``(batch, rows)`` of this process's share of each
  global batch of ``batch_size`` rounded up to ``multiple`` rows; ``rows`` -1 (weight 0, no
  attention) on padding rows."""
  b = -(-batch_size // multiple) * multiple
  if b % process_count:
    raise ValueError(f"batch of {b} rows is not divisible by {process_count} processes")
  local = b // process_count
  n = len(arrays["input_ids"])
  for start in range(0, n, b):
    members = np.arange(start, min(n, start + b))
    padded = np.concatenate([members, np.full(b - len(members), -1, members.dtype)])
    mine = padded[process_index * local:(process_index + 1) * local]
    real = mine >= 0
    batch = {k: v[np.where(real, mine, 0)] for k, v in arrays.items()}
    batch["attention_mask"] = batch["attention_mask"] * real[:, None].astype(np.int32)
    batch["weights"] = real.astype(np.float32)
    yield batch, np.where(real, mine, -1)


def span_logits(eval_step, params, features: sq.SquadFeatures, batch_size: int, mesh,
                num_devices: int, process_index: int = 0, process_count: int = 1):
  """``(start, end)`` float32 ``[n, q]`` logits of every window, and the mean loss."""
  n, q = features.input_ids.shape
  out = np.zeros((n, q, 2), np.float32)
  losses = []
  for batch, idx in window_batches(features.arrays(), batch_size, num_devices,
                                   process_index=process_index, process_count=process_count):
    m, p = eval_step(params, shard_batch(batch, mesh))
    m = steps.to_host(m)
    if process_count > 1:  # every process gets all logits, in process order
      p = multihost_utils.process_allgather(p, tiled=True)
      idx = multihost_utils.process_allgather(idx, tiled=True)
    p, idx = np.asarray(jax.device_get(p)), np.asarray(idx)
    keep = idx >= 0
    out[idx[keep]] = p[keep]
    losses.append((float(m["loss"]), float(np.sum(idx >= 0))))
  loss = sum(l * k for l, k in losses) / max(1.0, sum(k for _, k in losses))
  return out[..., 0], out[..., 1], loss


def score_logits(features: sq.SquadFeatures, start, end, *, n_best_size: int,
                 max_answer_length: int, version_2: bool,
                 null_score_diff_threshold: float = 0.0) -> tuple[dict, dict]:
  """``(predictions, scores)``: question id -> answer text, and the official EM/F1."""
  preds = squad_eval.predict_answers(features, start, end, n_best_size=n_best_size,
                                     max_answer_length=max_answer_length, version_2=version_2,
                                     null_score_diff_threshold=null_score_diff_threshold)
  return preds, squad_eval.squad_scores(squad_eval.references_of(features.examples), preds)


def evaluate_model(model, features: sq.SquadFeatures, out_dir=None, *, batch_size: int = 32,
                   n_best_size: int = squad_eval.N_BEST_SIZE,
                   max_answer_length: int = squad_eval.MAX_ANSWER_LENGTH, version_2: bool = False,
                   null_score_diff_threshold: float = 0.0, **encoder_kw) -> tuple[dict, dict]:
  """``(predictions, scores)`` of a span model (``BertForQuestionAnswering``) on the windows
  ``features``, on one host; ``encoder_kw`` (e.g. ``head_gate``) go to the encoder, so that an
  ablation is scored in EM/F1 without re-training. With ``out_dir``, ``predictions.json`` and
  ``eval.json`` are written there."""
  n, q = features.input_ids.shape
  start, end = np.zeros((n, q), np.float32), np.zeros((n, q), np.float32)
  for i in range(0, n, batch_size):
    sl = slice(i, min(n, i + batch_size))
    out = model(features.input_ids[sl], features.attention_mask[sl], features.token_type_ids[sl],
                **encoder_kw)
    start[sl], end[sl] = np.asarray(out["start_logits"]), np.asarray(out["end_logits"])
  preds, scores = score_logits(features, start, end, n_best_size=n_best_size,
                               max_answer_length=max_answer_length, version_2=version_2,
                               null_score_diff_threshold=null_score_diff_threshold)
  if out_dir is not None:
    squad_eval.write_evaluation(out_dir, preds, scores)
  return preds, scores


def load_squad_splits(config) -> tuple[list, list, dict]:
  """``(train, eval, note)``: ``SquadExample`` lists of ``config.squad`` / ``config.data`` and a
  note saying where they came from."""
  s, d = config.squad, config.data
  version = s.version
  cap = d.max_examples or None
  note = {"task": "squad", "source": s.source, "version": version}
  if s.source == "json":
    if not s.train_file:
      raise UserError("SQuAD fine-tuning needs squad.train_file (an official SQuAD JSON file, "
                      "e.g. train-v1.1.json)")
    train = sq.read_squad_json(local_copy(s.train_file), version)
    if s.eval_titles:
      titles = [t for t in s.eval_titles.split("|")]
      train, ev = sq.split_by_title(train, titles)
      note.update(train_file=str(s.train_file), eval_split=f"articles {s.eval_titles} of train_file")
    else:
      if not s.eval_file:
        raise UserError("SQuAD fine-tuning needs squad.eval_file (e.g. dev-v1.1.json) or "
                        "squad.eval_titles (articles of train_file to hold out)")
      ev = sq.read_squad_json(local_copy(s.eval_file), version)
      note.update(train_file=str(s.train_file), eval_file=str(s.eval_file))
  elif s.source == "tfds":
    tfds_config = {"v1": "v1.1", "v2": "v2.0"}[version]
    train = sq.read_squad_tfds(tfds_config, d.train_split, d.tfds_data_dir or None)
    ev = sq.read_squad_tfds(tfds_config, d.eval_split, d.tfds_data_dir or None)
    note.update(tfds=f"squad/{tfds_config}", train_split=d.train_split, eval_split=d.eval_split)
  else:
    raise UserError(f"squad.source must be 'json' or 'tfds', got {s.source!r}")
  train, ev = train[:cap] if cap else train, ev[:cap] if cap else ev
  if not train or not ev:
    raise UserError(f"the SQuAD {'train' if not train else 'eval'} set is empty")
  note.update(num_train=len(train), num_eval=len(ev))
  return train, ev, note


def window_settings(config) -> dict:
  return {"max_seq_length": config.data.max_seq_length, "doc_stride": config.squad.doc_stride,
          "max_query_length": config.squad.max_query_length}


def train_and_evaluate(config, workdir, tokenizer) -> dict:
  """Fine-tunes a span model on SQuAD as ``config`` says, in ``workdir`` (resuming a run found
  there), with ``tokenizer`` (``heads_jax.training.finetune`` picks it as for GLUE). Returns the
  summary of ``heads_jax.training.finetune.train_and_evaluate``."""
  job = TrainingJob(config, workdir)
  pid, pcount = job.process_index, job.process_count
  s = config.squad
  if s.version not in sq.VERSIONS:
    raise UserError(f"squad.version must be one of {sq.VERSIONS}, got {s.version!r}")
  train_ex, eval_ex, note = load_squad_splits(config)
  job.create_dir()
  job.check_data(rows_identity(train=train_ex, eval=eval_ex))  # a resume on other data: refused
  model = job.init_model("question-answering", tokenizer)
  model.config.check_max_length(config.data.max_seq_length)  # before encoding any data
  t0 = time.perf_counter()
  train_f = sq.build_features(train_ex, tokenizer, **window_settings(config))
  eval_f = sq.build_features(eval_ex, tokenizer, **window_settings(config))
  note.update(train_windows=len(train_f), eval_windows=len(eval_f))
  if job.is_main:
    job.dir.data_file.write_text(json.dumps(note))
  job.print(f"SQuAD {s.version}: {note['num_train']} train questions ({len(train_f)} windows), "
            f"{note['num_eval']} eval questions ({len(eval_f)} windows) in "
            f"{time.perf_counter() - t0:.1f}s")

  state = job.initial_state(model, init_subtree="bert")
  del model
  train_step = job.train_step(span_loss)
  eval_step = job.eval_step(span_loss, with_predictions=True)

  best_ckpts, best = job.best_checkpoints(state)
  select = config.select_metric or "f1"
  last_eval = {}

  def eval_fn(state, step):
    nonlocal best, last_eval
    start, end, loss = span_logits(eval_step, state["params"], eval_f, config.eval_batch_size,
                                   job.mesh, job.num_devices, pid, pcount)
    preds, scores = score_logits(eval_f, start, end, n_best_size=s.n_best_size,
                                 max_answer_length=s.max_answer_length,
                                 version_2=s.version == "v2",
                                 null_score_diff_threshold=s.null_score_diff_threshold)
    ev = {"exact_match": scores["exact_match"], "f1": scores["f1"], "loss": loss}
    if job.is_main:
      with staged_output(job.dir.sub(f"eval/step_{int(step):07d}"), fetch_existing=False) as out:
        squad_eval.write_evaluation(out, preds, dict(scores, step=int(step), loss=loss))
    last_eval = dict(ev, step=int(step))
    if ev[select] > best["score"]:
      best = {"score": float(ev[select]), "step": int(step), **{k: float(v) for k, v in ev.items()}}
      best_ckpts.save(step, {"params": state["params"]}, {"best": best}, force=True)
    ev["best_" + select] = best["score"]
    return ev

  batches = WindowBatches(train_f.arrays(), config.batch_size, config.data_seed, pid, pcount)
  job.print(f"fine-tuning SQuAD from {job.origin} at step {job.start_step}/{config.num_train_steps}")
  state, history = job.train(state, train_step, batches.iterate(job.start_step),
                             seq_len=config.data.max_seq_length, eval_fn=eval_fn,
                             meta={"task": "squad", "origin": job.origin})
  done = int(steps.to_host(state["step"]))
  exports, best = job.export_best(state, best_ckpts, best, tokenizer)
  best_ckpts.close()
  if "step" in best:
    best["predictions"] = str(job.dir.sub(f"eval/step_{best['step']:07d}/predictions.json"))
  summary = {"best": best, "final_eval": last_eval, "history": history, "data": note,
             "exports": exports, "workdir": str(job.dir), "start_step": job.start_step,
             "final_step": done, "origin": job.origin, "select_metric": select, "state": state}
  if job.is_main:
    job.dir.summary_file.write_text(json.dumps(
        {k: v for k, v in summary.items() if k not in ("history", "state")}, indent=2, default=str))
  return summary
