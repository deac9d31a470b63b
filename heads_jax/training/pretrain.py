"""BERT pre-training (masked LM + next-sentence prediction): ``train_and_evaluate(config, workdir)``.

The config is ``configs/pretrain.py`` (see its presets); the set-up shared with fine-tuning is
``heads_jax.training.job.TrainingJob``. The run directory (``RunDir``) holds::

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

import functools
import os

import numpy as np

from heads_jax.data.corpora import PreparedCorpus, make_corpus
from heads_jax.data.prefetch import available_cores
from heads_jax.data.pretraining import PretrainingExamples, PretrainingSpec
from heads_jax.storage import local_copy
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.parallel import shard_batch
from heads_jax.training import loop, steps
from heads_jax.training.job import TrainingJob, files_identity


def _weights(text: str):
  text = (text or "").strip()
  return [float(w) for w in text.split(",")] if text else None


def build_examples(config, tokenizer, *, eval_split: bool = False) -> PretrainingExamples:
  """The training (or, with ``eval_split``, held-out) example stream of ``config.data``."""
  d = config.data
  sources = d.eval_sources if (eval_split and d.eval_sources) else d.sources
  # Held-out text is never trained on: without eval_sources both streams read data.sources, the
  # training stream its train side and the evaluation stream its eval side (a prepared corpus has
  # the split built in; text and TFDS sources are split by data.heldout_fraction).
  fraction = 0.0 if d.eval_sources else d.heldout_fraction
  corpus = make_corpus(sources, layout=d.layout, split=d.split, data_dir=d.tfds_data_dir or None,
                       text_key=d.text_key, weights=_weights(d.weights),
                       side="eval" if eval_split else "train", heldout_fraction=fraction)
  spec = PretrainingSpec(max_seq_length=d.max_seq_length, max_predictions=d.max_predictions,
                         masked_lm_prob=d.masked_lm_prob, short_seq_prob=d.short_seq_prob,
                         random_next_prob=d.random_next_prob, whole_word_mask=d.whole_word_mask)
  seed = d.eval_seed if eval_split else config.data_seed
  return PretrainingExamples(corpus, tokenizer, spec, seed=seed)


def corpus_identity(corpus, *, cache=None) -> dict:
  """The content of a corpus (``heads_jax.data.corpora``): its text files' and a prepared
  corpus's files' digests (``heads_jax.training.job.files_identity``); a TFDS corpus by its name
  and split (its files are TFDS's)."""
  out = {}
  for c in getattr(corpus, "corpora", [corpus]):
    if isinstance(c, PreparedCorpus):
      out.update(files_identity([os.path.dirname(c.paths[0])], cache=cache))
    elif hasattr(c, "paths"):
      out.update(files_identity(c.paths, cache=cache))
    else:
      out[f"tfds:{c.name}"] = f"tfds:{c.name} split {c.split}"
  return out


def train_and_evaluate(config, workdir) -> dict:
  """Pre-trains as ``config`` says, in ``workdir`` (resuming a run found there).

  Returns a summary: ``history`` (logged train metrics per step), ``eval`` (the last
  evaluation), ``start_step``, ``origin``, ``tokens_per_s`` (mean over the logged intervals
  after the first), ``workdir``.
  """
  job = TrainingJob(config, workdir)  # checks the settings first
  job.create_dir()
  tokenizer = load_tokenizer(local_copy(config.tokenizer) if config.tokenizer else None)
  examples = build_examples(config, tokenizer)
  # a resume on other text is refused; the digests are kept beside a local run (hashed once)
  job.check_data(corpus_identity(examples.corpus, cache=None if job.dir.is_remote else job.dir.root))
  model = job.init_model("pretraining", tokenizer)
  cfg = model.config
  if config.data.max_seq_length > cfg.max_position_embeddings:
    raise UserError(f"data.max_seq_length {config.data.max_seq_length} exceeds the model's "
                    f"max_position_embeddings {cfg.max_position_embeddings}")
  state = job.initial_state(model)
  del model
  loss_fn = functools.partial(steps.pretraining_loss, mlm_logits=config.get("mlm_logits", "float32"))
  train_step = job.train_step(loss_fn)
  eval_step = job.eval_step(loss_fn)
  eval_examples = build_examples(config, tokenizer, eval_split=True) if config.eval_batches else None
  pid, pcount = job.process_index, job.process_count

  unigram = None
  if eval_examples is not None and config.data.unigram_examples > 0:
    unigram = eval_examples.unigram_entropy(config.data.unigram_examples)
    job.print(f"unigram baseline of the held-out text: {unigram:.3f} nats per wordpiece (the MLM "
              f"loss of a model without context, from {config.data.unigram_examples} examples)")
  last_eval = {}

  def eval_fn(state, step):
    nonlocal last_eval
    rows = []
    for i in range(config.eval_batches):
      batch = eval_examples.batch(i, config.batch_size, pid, pcount)
      rows.append(steps.to_host(eval_step(state["params"], shard_batch(batch, job.mesh))))
    last_eval = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    if unigram is not None:
      last_eval["unigram_baseline"] = unigram
    return last_eval

  batches = examples.batches(job.start_step, config.batch_size, process_index=pid,
                             process_count=pcount, prefetch=config.data.prefetch,
                             num_workers=config.data.num_workers)
  workers = getattr(batches, "workers", None)
  auto = (f" (data.num_workers={config.data.num_workers}: all but 2 of this host's "
          f"{available_cores()} cores)" if config.data.num_workers < 0 else "")
  job.print(f"input pipeline: {f'{workers} worker processes' if workers else 'one background thread'}"
            f"{auto}; the log says when it starves the device")
  job.print(f"pre-training {cfg.num_layers}x{cfg.num_heads} hidden {cfg.hidden_size} from "
            f"{job.origin} at step {job.start_step}/{config.num_train_steps}; "
            f"{loop.device_phrase()}")
  state, history = job.train(state, train_step, batches, seq_len=config.data.max_seq_length,
                             eval_fn=eval_fn if config.eval_batches else None,
                             meta={"preset": config.preset, "origin": job.origin})
  done = int(steps.to_host(state["step"]))
  if config.export and done >= config.num_train_steps and job.is_main:
    job.export(state["params"], tokenizer, "model", "hf")
  job.close()
  speeds = [h["tokens_per_s"] for h in history[1:] if "tokens_per_s" in h]
  return {"history": history, "eval": last_eval, "unigram_baseline": unigram,
          "start_step": job.start_step, "origin": job.origin,
          "final_step": done, "tokens_per_s": float(np.mean(speeds)) if speeds else None,
          "workdir": str(job.dir), "state": state}
