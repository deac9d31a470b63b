"""GLUE examples as arrays: a run's train/eval split, encoding, batches, and the task metrics.

Shared by fine-tuning (``heads_jax.training.finetune``) and the ablation's evaluation
(``heads_jax.ablation.evaluate``).

* ``load_task_splits``: the labelled train and eval examples of a task. With
  ``holdout_fraction > 0`` the train split is shuffled with ``holdout_seed`` and cut: the first
  ``round(holdout_fraction * n)`` rows become the eval set, the rest the train set. A task
  without its train split (the shared copy of QNLI has only dev and test; QQP only a 23K-row
  ``train_subset``) is an error unless ``fallback_split`` names the split to cut instead (a
  holdout of it, 10% unless ``holdout_fraction`` says otherwise): training on a part of a split
  that is otherwise evaluated is never silent. The returned note says which rows were used.
* ``encode_examples``: ``[CLS] A [SEP] B [SEP]`` with longest-first truncation to
  ``max_length``, padded to ``max_length`` (training: one shape) or to the longest example.
* ``EpochBatches``: training batch ``N`` holds the examples at positions ``N * B .. N * B + B - 1``
  of the endless sequence of epochs, each epoch a permutation drawn from ``(seed, epoch)``: a
  function of the seed and ``N``, so resumed runs see the same batches.
* ``eval_batches``: every row once, in order or sorted by length and cut to the batch's longest
  example; padding rows have weight 0.
* ``classification_metrics`` / ``metrics_from_counts``: accuracy for every task, precision,
  recall and F1 of the positive class (label 1), which MRPC and QQP report.

Arrays: ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]``, ``labels``
int32 ``[n]``; batches add ``weights`` float32 ``[b]``.
"""

from __future__ import annotations

import logging

import numpy as np

from heads_jax.data import glue
from heads_jax.data.encoding import encode_texts
from heads_jax.errors import UserError

log = logging.getLogger(__name__)

TEXT_ARRAYS = ("input_ids", "attention_mask", "token_type_ids")


def load_task_splits(task: str, *, source: str = "tsv", glue_dir=None, tfds_data_dir=None,
                     train_split: str = "train", eval_split: str = "dev",
                     holdout_fraction: float = 0.0, holdout_seed: int = 0,
                     max_examples: int | None = None, fallback_split: str = ""):
  """``(train, eval, note)``: lists of ``GlueExample`` and a dict saying where they came from
  (``task``, ``source``, ``train_split``, ``eval_split``, ``num_train``, ``num_eval``, and for a
  holdout ``holdout_fraction``, ``holdout_seed``, ``eval_idx``). ``source``: ``"tsv"`` (GLUE
  TSV folders under ``glue_dir``) or ``"tfds"``. See the module docstring for the holdout."""
  info = glue.task_info(task)
  note = {"task": info.name, "source": source}

  def load(split):
    if source == "tfds":
      return glue.load_glue_tfds(info.name, split, data_dir=tfds_data_dir or None,
                                 max_examples=max_examples or None)
    if source == "tsv":
      return glue.load_glue_tsv(glue_dir, info.name, split, max_examples=max_examples or None)
    raise ValueError(f"data.source must be 'tsv' or 'tfds', got {source!r}")

  used_split = train_split
  try:
    train = load(train_split)
  except FileNotFoundError as e:
    if source != "tsv" or not fallback_split or fallback_split == train_split:
      raise UserError(
          f"GLUE {info.name} has no {train_split} split under {glue_dir} "
          f"({str(e).split(';')[0]}); use TFDS (data.source=tfds), or name the split to cut a "
          f"training set from explicitly: data.fallback_train_split=dev trains on a seeded 90% of "
          f"dev and evaluates on the other 10%") from None
    train = load(fallback_split)
    log.warning("GLUE %s has no %s split in %s; training on a holdout of %s "
                "(data.fallback_train_split)", info.name, train_split, glue_dir, fallback_split)
    used_split = fallback_split
  holdout = holdout_fraction
  if used_split != train_split and holdout <= 0:
    holdout = 0.1
  note["train_split"] = used_split
  if holdout > 0:
    n = len(train)
    order = np.random.default_rng(holdout_seed).permutation(n)
    k = int(round(holdout * n))
    if k == 0 or k == n:
      raise ValueError(f"holdout_fraction {holdout} leaves no train or eval rows of {n}")
    ev = [train[i] for i in sorted(order[:k].tolist())]
    train = [train[i] for i in sorted(order[k:].tolist())]
    note.update(eval_split=f"holdout of {used_split}", holdout_fraction=holdout,
                holdout_seed=holdout_seed, eval_idx=[e.idx for e in ev])
  else:
    ev = load(eval_split)
    note["eval_split"] = eval_split
  for name, rows in (("train", train), ("eval", ev)):
    if not rows:
      raise ValueError(f"GLUE {info.name}: the {name} set is empty")
    if any(e.label is None for e in rows):
      raise ValueError(f"GLUE {info.name}: the {name} set has unlabelled rows (a test split?); "
                       f"use the train/dev splits")
  note.update(num_train=len(train), num_eval=len(ev))
  return train, ev, note


def encode_examples(examples, tokenizer, max_length: int, *, pad_to_max_length: bool = True) -> dict:
  """``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]`` and ``labels`` ``[n]``
  of labelled examples; ``q`` is ``max_length``, or the longest encoded example when
  ``pad_to_max_length`` is False. Pairs are truncated longest-first."""
  a = [e.text_a for e in examples]
  b = [e.text_b for e in examples] if examples[0].text_b is not None else None
  # token_type_ids: the segments of DESIGN.md section 3 for any family's template
  out = encode_texts(tokenizer, a, b, max_length=max_length, pad_to_max_length=pad_to_max_length)
  out["labels"] = np.asarray([e.label for e in examples], np.int32)
  return out


class EpochBatches:
  """Training batches of encoded arrays; batch ``N`` is a function of ``(seed, N)``. Process
  ``p`` of ``P`` gets rows ``[p * B / P, (p + 1) * B / P)`` of each global batch."""

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


def eval_batches(arrays: dict, batch_size: int, multiple: int, *, process_index: int = 0,
                 process_count: int = 1, bucket_step: int | None = None):
  """Evaluation batches covering every row once. Yields ``(batch, rows)``: this process's rows
  of each global batch of ``batch_size`` rounded up to ``multiple`` (the number of devices)
  rows, ``rows`` their index in ``arrays`` (-1 on padding rows, which have weight 0 and an
  all-zero attention mask).

  ``bucket_step`` None: rows in order, at full length. Otherwise rows sorted by length, and each
  batch's text arrays cut to its longest example rounded up to a multiple of ``bucket_step``
  (so short sentences do not pay for every position; few shapes to compile).
  """
  if batch_size < 1:
    raise ValueError(f"batch size must be >= 1, got {batch_size}")
  b = -(-batch_size // multiple) * multiple
  if b % process_count:
    raise ValueError(f"batch of {b} rows is not divisible by {process_count} processes")
  local = b // process_count
  n = len(arrays["labels"])
  lengths = arrays["attention_mask"].sum(-1)
  order = np.arange(n) if bucket_step is None else np.argsort(lengths, kind="stable")
  full = arrays["input_ids"].shape[1]
  for start in range(0, n, b):
    members = order[start:start + b]
    padded = np.concatenate([members, np.full(b - len(members), -1, members.dtype)])
    mine = padded[process_index * local:(process_index + 1) * local]
    real = mine >= 0
    take = np.where(real, mine, 0)
    batch = {k: v[take] for k, v in arrays.items()}
    if bucket_step is not None:
      k = min(full, max(1, -(-int(lengths[members].max()) // bucket_step) * bucket_step))
      for name in TEXT_ARRAYS:
        batch[name] = np.ascontiguousarray(batch[name][:, :k])
    batch["attention_mask"] = batch["attention_mask"] * real[:, None].astype(np.int32)
    batch["weights"] = real.astype(np.float32)
    yield batch, np.where(real, mine, -1)


def metrics_from_counts(correct, tp, fp, fn, n) -> dict:
  """Accuracy and (positive class 1) precision, recall, F1 from counts of ``n`` rows."""
  precision = tp / (tp + fp) if tp + fp else 0.0
  recall = tp / (tp + fn) if tp + fn else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"accuracy": correct / n if n else float("nan"), "f1": f1, "precision": precision,
          "recall": recall}


def classification_metrics(pred: np.ndarray, labels: np.ndarray) -> dict:
  """Accuracy and (positive class 1) precision, recall, F1 of predictions."""
  pred, labels = np.asarray(pred), np.asarray(labels)
  return metrics_from_counts(float(np.sum(pred == labels)),
                             float(np.sum((pred == 1) & (labels == 1))),
                             float(np.sum((pred == 1) & (labels != 1))),
                             float(np.sum((pred != 1) & (labels == 1))), len(labels))
