"""GLUE examples as arrays: encoding, batches, and the task metrics.

Shared by fine-tuning (``heads_jax.training.finetune``) and the ablation's evaluation
(``heads_jax.ablation.evaluate``); which rows they use is ``heads_jax.data.glue_splits``.

* ``encode_labelled``: ``[CLS] A [SEP] B [SEP]`` with longest-first truncation to
  ``max_length``, padded to ``max_length`` (training: one shape) or to the longest example.
* ``EpochBatches``: training batch ``N`` holds the examples at positions ``N * B .. N * B + B - 1``
  of the endless sequence of epochs, each epoch a permutation drawn from ``(seed, epoch)``: a
  function of the seed and ``N``, so resumed runs see the same batches.
* ``eval_batches``: every row once, in order or sorted by length and cut to the batch's longest
  example; padding rows have weight 0.
* ``classification_metrics`` / ``metrics_from_counts``: accuracy for every task, precision,
  recall and F1 of the positive class (label 1), which MRPC and QQP report.
* ``task_metrics``: the metrics of a task's predictions (the task table's ``metrics``):
  the above, Matthews' correlation (CoLA), Pearson's and Spearman's correlations and the mean
  squared error of a regression (STS-B).

Arrays: ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]``, ``labels``
int32 ``[n]`` (float32 for a regression task); batches add ``weights`` float32 ``[b]``.
"""

from __future__ import annotations

import numpy as np

from heads_jax.data.encoding import encode_texts

TEXT_ARRAYS = ("input_ids", "attention_mask", "token_type_ids")


def encode_labelled(examples, tokenizer, max_length: int, *, pad_to_max_length: bool = True) -> dict:
  """``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, q]`` and ``labels`` ``[n]``
  of labelled examples; ``q`` is ``max_length``, or the longest encoded example when
  ``pad_to_max_length`` is False. Pairs are truncated longest-first."""
  a = [e.text_a for e in examples]
  b = [e.text_b for e in examples] if examples[0].text_b is not None else None
  # token_type_ids: the segments of DESIGN.md section 3 for any family's template
  out = encode_texts(tokenizer, a, b, max_length=max_length, pad_to_max_length=pad_to_max_length)
  regression = isinstance(examples[0].label, float)
  out["labels"] = np.asarray([e.label for e in examples], np.float32 if regression else np.int32)
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


def matthews_corrcoef(pred: np.ndarray, labels: np.ndarray) -> float:
  """Matthews' correlation coefficient of class predictions (any number of classes: Gorodkin's
  R_K, which for two classes is ``(tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))``);
  0 when a marginal is constant (as scikit-learn)."""
  pred, labels = np.asarray(pred).ravel(), np.asarray(labels).ravel()
  classes = np.union1d(pred, labels)
  c = np.array([[np.sum((labels == a) & (pred == b)) for b in classes] for a in classes],
               np.float64)                                     # confusion: true x predicted
  t, p, n = c.sum(1), c.sum(0), c.sum()
  cov = np.trace(c) * n - t @ p
  denom = np.sqrt(n * n - p @ p) * np.sqrt(n * n - t @ t)
  return float(cov / denom) if denom else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks, ties given their average rank."""
  order = np.argsort(x, kind="stable")
  xs = x[order]
  ranks = np.empty(len(x), np.float64)
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and xs[j + 1] == xs[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def pearson(a, b) -> float:
  """Pearson's correlation (nan when either side is constant)."""
  a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
  a, b = a - a.mean(), b - b.mean()
  denom = np.sqrt(np.sum(a * a) * np.sum(b * b))
  return float(np.sum(a * b) / denom) if denom else float("nan")


def spearman(a, b) -> float:
  """Spearman's rank correlation: Pearson's on ranks (ties averaged)."""
  return pearson(_ranks(np.asarray(a, np.float64).ravel()),
                 _ranks(np.asarray(b, np.float64).ravel()))


def regression_metrics(pred: np.ndarray, labels: np.ndarray) -> dict:
  """Pearson's and Spearman's correlations and the mean squared error of scores."""
  pred, labels = np.asarray(pred, np.float64).ravel(), np.asarray(labels, np.float64).ravel()
  return {"pearson": pearson(pred, labels), "spearman": spearman(pred, labels),
          "mse": float(np.mean((pred - labels) ** 2)) if len(labels) else float("nan")}


def task_metrics(info, pred: np.ndarray, labels: np.ndarray) -> dict:
  """The metrics of ``info`` (a `heads_jax.data.glue.GlueTask`): regression metrics for a
  regression task, else classification metrics (plus ``matthews`` where the task reports it)."""
  if info.is_regression:
    return regression_metrics(pred, labels)
  out = classification_metrics(pred, labels)
  if "matthews" in info.metrics:
    out["matthews"] = matthews_corrcoef(pred, labels)
  return out
