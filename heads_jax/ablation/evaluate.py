"""Jitted, data-parallel evaluation of a GLUE classifier with a head gate.

    data = load_eval_data("glue-tsv:/data/glue/SST-2", tokenizer)        # or glue:sst2, sst2, ...
    ev = Evaluator(model, data)                   # model: BertForSequenceClassification
    ev.evaluate()                                 # {"accuracy": ..., "f1": ..., "loss": ..., "n": ...}
    ev.evaluate(head_gate=gate, gate_mode="uniform")
    ev.evaluate(segment_removal=removal)          # [l, h, 2], see heads_jax.model.bert

The dev set is encoded once (``heads_jax.data.glue_batches``, as fine-tuning), sorted by
length and cut into batches whose length is rounded up to a multiple of ``bucket_step`` (so
short sentences do not pay for 128 positions); every batch is padded to a multiple of the number
of devices with weight-0 rows and put on the ``data`` mesh once, and reused by every
evaluation. One jitted call per batch returns the batch's sums
(correct predictions, true / false positives, false negatives, summed loss, rows); they are
added on the device and fetched once per evaluation. The model's state is replicated on the
mesh once. ``Evaluator`` also carries what ``heads_jax.ablation.importance`` needs (graph,
state, batches).

Metrics follow ``heads_jax.data.glue.TASKS``: accuracy for every task, and F1 of the positive
class (label 1) for MRPC and QQP (``glue_batches.metrics_from_counts``, as fine-tuning).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from heads_jax.data import glue, glue_batches, glue_splits
from heads_jax.data.specs import load_spec, parse_spec
from heads_jax.errors import UserError
from heads_jax.model.loading import load_model
from heads_jax.parallel import data_mesh, replicate, shard_batch
from heads_jax.training.rundir import RunDir

SUM_NAMES = ("correct", "tp", "fp", "fn", "loss", "n")
GATE_MODES = ("remove", "uniform")


@dataclasses.dataclass
class EvalData:
  """An encoded, labelled GLUE evaluation set.

  ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, k]`` (padded to the longest
  example), ``labels`` int32 ``[n]``, ``task`` the `glue.GlueTask`, ``name`` a description.
  """
  input_ids: np.ndarray
  attention_mask: np.ndarray
  token_type_ids: np.ndarray
  labels: np.ndarray
  task: glue.GlueTask
  name: str
  rows: np.ndarray | None = None   # which rows of the source were kept (None: all)

  def __len__(self) -> int:
    return len(self.labels)

  @property
  def lengths(self) -> np.ndarray:
    return self.attention_mask.sum(-1).astype(np.int32)

  @property
  def metric_names(self) -> tuple[str, ...]:
    return self.task.metrics


def eval_rows_from_finetune(path) -> list[int] | None:
  """The ``eval_idx`` rows a fine-tuning run held out (its ``data.json``), or None when it
  evaluated on a whole split. ``path``: the ``data.json`` or the run's work directory."""
  path = Path(path)
  if path.is_dir():
    path = Path(RunDir(path).data_file)   # the fine-tuning run's own file (training.rundir)
  if not path.is_file():
    raise UserError(f"{path} does not exist: --finetune-data takes the data.json of a fine-tuning "
                    "run (or its work directory)")
  note = json.loads(path.read_text())
  rows = note.get("eval_idx")
  return None if rows is None else [int(i) for i in rows]


def load_eval_data(spec: str, tokenizer, *, task: str | None = None, max_length: int = 128,
                   max_examples: int | None = None, rows=None) -> EvalData:
  """Reads and encodes a labelled GLUE set.

  Args:
    spec: a data spec of ``heads_jax.data.specs`` naming GLUE data (``glue:TASK[:SPLIT]``,
      ``glue-tsv:DIR/TASK[:SPLIT]``, ``sst2``, ``mrpc``).
    task: the GLUE task (default: the spec's); must match the spec's when both are given.
    rows: keep only these ``idx`` values (e.g. a fine-tuning run's held-out rows).
  """
  parsed = parse_spec(spec)
  if parsed.kind not in ("glue", "glue-tsv"):
    raise UserError(f"data spec {spec!r} is not GLUE data; evaluation needs labels: use "
                    "glue:TASK[:SPLIT], glue-tsv:DIR/TASK[:SPLIT], sst2 or mrpc")
  info = glue.task_info(task or parsed.task)
  if info.name != parsed.task:
    raise UserError(f"--task {task} does not match the data {spec!r} (task {parsed.task})")
  dataset = load_spec(parsed, None if rows is not None else max_examples)
  examples = dataset.examples
  kept = None
  if rows is not None:
    try:
      examples = glue_splits.select_rows(examples, rows)
    except ValueError as e:
      raise UserError(f"{str(e).replace('the split', repr(spec))}; was the fine-tuning run's "
                      "data.json made from this data?") from None
    if max_examples is not None:
      examples = examples[:max_examples]
    kept = np.asarray([e.idx for e in examples], np.int64)
  if not examples:
    raise UserError("the evaluation set is empty")
  if any(e.label is None for e in examples):
    raise UserError("the evaluation data has unlabelled rows (a GLUE test split?): use the dev "
                    "split (glue-tsv:DIR/TASK:dev or glue:TASK:validation)")
  enc = glue_batches.encode_labelled(examples, tokenizer, max_length, pad_to_max_length=False)
  name = dataset.name + (f" ({len(examples)} held-out rows)" if rows is not None else "")
  return EvalData(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], enc["labels"],
                  info, name, kept)


def make_batches(data: EvalData, batch_size: int, multiple: int, bucket_step: int = 16) -> list:
  """Host batches ``[(dict of [b, k] arrays with weights [b], rows [b])]``: examples sorted by
  length, each batch cut to its longest example rounded up to ``bucket_step`` and padded to
  ``batch_size`` rounded up to ``multiple`` rows (weight 0, row -1)."""
  if batch_size < 1:
    raise UserError(f"batch size must be >= 1, got {batch_size}")
  arrays = {name: getattr(data, name) for name in glue_batches.TEXT_ARRAYS + ("labels",)}
  return list(glue_batches.eval_batches(arrays, batch_size, multiple, bucket_step=bucket_step))


def batch_sums(logits, labels, weights):
  """float32 ``[6]`` (``SUM_NAMES``): weighted correct, tp, fp, fn (positive class 1), summed
  cross-entropy and number of rows."""
  logits = logits.astype(jnp.float32)
  w = weights.astype(jnp.float32)
  pred = jnp.argmax(logits, -1)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  pos, true = pred == 1, labels == 1
  return jnp.stack([jnp.sum(w * (pred == labels)), jnp.sum(w * (pos & true)),
                    jnp.sum(w * (pos & ~true)), jnp.sum(w * (~pos & true)),
                    jnp.sum(w * nll), jnp.sum(w)])


def metrics_from_sums(sums) -> dict:
  """Accuracy, F1 (positive class 1), precision, recall, mean loss and n from ``batch_sums``."""
  s = dict(zip(SUM_NAMES, (float(x) for x in np.asarray(sums))))
  n = s["n"]
  return dict(glue_batches.metrics_from_counts(s["correct"], s["tp"], s["fp"], s["fn"], n),
              loss=s["loss"] / n if n else float("nan"), n=int(round(n)))


def gated_forward(graphdef, state, batch: dict, gate, removal, gate_mode: str,
                  renormalise: bool) -> dict:
  """The model ``nnx.merge(graphdef, state)`` on ``batch`` (``input_ids``, ``attention_mask``,
  ``token_type_ids`` ``[b, q]``), deterministic, with head gates ``gate`` ``[l, h]`` applied as
  ``gate_mode`` and the segment removal ``removal`` ``[l, h, 2]`` (rows renormalised or not):
  its output dict (the evaluators' one forward pass, traced inside their jitted call)."""
  model = nnx.merge(graphdef, state)
  return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
               head_gate=gate, gate_mode=gate_mode, segment_removal=removal,
               renormalise_segments=renormalise, deterministic=True)


def check_classifier(model):
  """The model must be a classifier (``BertForSequenceClassification``)."""
  if not hasattr(model, "classifier") or not hasattr(model, "bert"):
    raise UserError(f"the model is a {type(model).__name__}, not a fine-tuned classifier: pass the "
                    "directory of a fine-tuned model (e.g. a fine-tuning run's best_model)")


class Evaluator:
  """Evaluates a classifier on a fixed data set under head gates (see the module docstring).

  Attributes used by the importance and pruning code: ``graphdef``, ``state`` (replicated),
  ``batches`` (device batches), ``mesh``, ``num_layers``, ``num_heads``, ``task``.
  """

  def __init__(self, model, data: EvalData, *, batch_size: int = 64, mesh=None,
               bucket_step: int = 16):
    check_classifier(model)
    if data.task.is_regression:
      raise UserError(f"GLUE {data.task.name} is a regression (Pearson/Spearman over every "
                      "prediction); the ablation scores classifiers (accuracy, F1) and SQuAD "
                      "models (EM/F1): ablate a classification task")
    if model.num_labels != data.task.num_labels:
      raise UserError(f"the model has {model.num_labels} labels but GLUE {data.task.name} has "
                      f"{data.task.num_labels}: was it fine-tuned on this task?")
    cfg = model.config
    if data.input_ids.shape[1] > cfg.max_position_embeddings:
      raise UserError(f"examples of {data.input_ids.shape[1]} positions exceed the model's "
                      f"{cfg.max_position_embeddings}; lower --max-length")
    if int(data.input_ids.max()) >= cfg.vocab_size:
      raise UserError("the data has token ids beyond the model's vocabulary: encode it with the "
                      "model's own tokenizer")
    self.data, self.task = data, data.task
    self.num_layers, self.num_heads = cfg.num_layers, cfg.num_heads
    self.mesh = data_mesh() if mesh is None else mesh
    local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
    self.multiple = max(1, len(local))
    self.graphdef, state = nnx.split(model)
    self.state = replicate(state, self.mesh)
    host = make_batches(data, batch_size, self.multiple, bucket_step)
    self.rows = [rows for _, rows in host]
    self.batches = [shard_batch(b, self.mesh) for b, _ in host]
    graphdef = self.graphdef

    def run(state, batch, gate, removal, gate_mode, renormalise):
      out = gated_forward(graphdef, state, batch, gate, removal, gate_mode, renormalise)
      return batch_sums(out["logits"], batch["labels"], batch["weights"])

    self._run = jax.jit(run, static_argnames=("gate_mode", "renormalise"))
    self._add = jax.jit(lambda a, b: a + b)

  def _gate(self, head_gate):
    if head_gate is None:
      head_gate = np.ones((self.num_layers, self.num_heads), np.float32)
    head_gate = np.asarray(head_gate, np.float32)
    if head_gate.shape != (self.num_layers, self.num_heads):
      raise ValueError(f"head_gate must be [layers, heads] = {(self.num_layers, self.num_heads)}, "
                       f"got {head_gate.shape}")
    return replicate(jnp.asarray(head_gate), self.mesh)

  def sums(self, head_gate=None, *, gate_mode: str = "remove", segment_removal=None,
           renormalise: bool = False) -> np.ndarray:
    """The summed ``SUM_NAMES`` over the data set (one fetch)."""
    if gate_mode not in GATE_MODES:
      raise UserError(f"gate mode must be one of {GATE_MODES}, got {gate_mode!r}")
    gate = self._gate(head_gate)
    removal = None
    if segment_removal is not None:
      removal = np.asarray(segment_removal, np.float32)
      if removal.shape != (self.num_layers, self.num_heads, 2):
        raise ValueError(f"segment_removal must be [layers, heads, 2] = "
                         f"{(self.num_layers, self.num_heads, 2)}, got {removal.shape}")
      removal = replicate(jnp.asarray(removal), self.mesh)
    total = None
    for batch in self.batches:
      s = self._run(self.state, batch, gate, removal, gate_mode=gate_mode,
                    renormalise=bool(renormalise))
      total = s if total is None else self._add(total, s)
    return np.asarray(total)

  def evaluate(self, head_gate=None, *, gate_mode: str = "remove", segment_removal=None,
               renormalise: bool = False) -> dict:
    """Metrics on the whole data set with ``head_gate`` ``[l, h]`` (default all 1: the
    unablated model) applied in ``gate_mode`` and the optional ``segment_removal``
    ``[l, h, 2]``: accuracy, f1, precision, recall, loss (mean cross-entropy), n."""
    return metrics_from_sums(self.sums(head_gate, gate_mode=gate_mode,
                                       segment_removal=segment_removal,
                                       renormalise=renormalise))


def load_classifier(path, dtype: str | None = None):
  """``(model, tokenizer)`` of a fine-tuned classifier directory (heads_jax or Hugging Face)."""
  model, tokenizer = load_model(path, head="auto", dtype=dtype)
  check_classifier(model)
  return model, tokenizer


# -------------------------------------------------------------------------------------------------
# SQuAD: the ablations scored in exact match and F1 (Guan et al. 2020, Tables 2 and 3)

SQUAD_METRICS = ("exact_match", "f1")


@dataclasses.dataclass(frozen=True)
class SquadTask:
  """What the ablation tables read of a task, for SQuAD (a pair task: question and context are
  the two "sentences" of Guan et al. Table 3)."""
  name: str = "squad"
  is_pair: bool = True
  is_regression: bool = False
  metrics: tuple = SQUAD_METRICS


@dataclasses.dataclass
class SquadEvalData:
  """The windows of a SQuAD evaluation set (``heads_jax.data.squad.SquadFeatures``), a
  ``name``, and ``metric_names``: exact match and F1, as fractions like the classifiers'
  accuracy (the paper prints them in percent)."""
  features: object
  name: str
  version_2: bool = False
  task: SquadTask = SquadTask()

  def __len__(self) -> int:
    return len(self.features.examples)

  @property
  def metric_names(self) -> tuple[str, ...]:
    return SQUAD_METRICS


def is_squad_spec(spec: str) -> bool:
  """Does the data spec name SQuAD data (``squad:FILE...``, ``squad-tfds:...``)?"""
  return str(spec).split(":", 1)[0] in ("squad", "squad-tfds")


def load_squad_eval_data(spec: str, tokenizer, *, max_length: int = 384, doc_stride: int = 128,
                         max_query_length: int = 64, max_examples: int | None = None) -> SquadEvalData:
  """Reads a SQuAD spec (``squad:FILE[:v1|v2][:n=N][:seed=S]``, ``squad-tfds:...``) and builds
  its windows as BERT's ``run_squad.py`` (``heads_jax.data.squad.build_features``)."""
  from heads_jax.data import squad as sq
  parsed = parse_spec(spec)
  if parsed.kind not in ("squad", "squad-tfds"):
    raise UserError(f"data spec {spec!r} is not SQuAD data: a span model is evaluated on "
                    "squad:FILE[:v1|v2][:n=N] or squad-tfds:[v1.1|v2.0][:SPLIT]")
  dataset = load_spec(parsed, max_examples)
  examples = dataset.examples
  if not examples:
    raise UserError(f"{spec!r} holds no questions")
  version_2 = any(not e.answers for e in examples)
  features = sq.build_features(examples, tokenizer, max_seq_length=max_length,
                               doc_stride=doc_stride, max_query_length=max_query_length)
  return SquadEvalData(features, f"{dataset.name} ({len(examples)} questions, {len(features)} "
                                 f"windows)", version_2)


def check_span_model(model):
  """The model must be a span (question-answering) model."""
  if not hasattr(model, "qa_outputs") or not hasattr(model, "bert"):
    raise UserError(f"the model is a {type(model).__name__}, not a SQuAD (question-answering) "
                    "model: pass a *ForQuestionAnswering checkpoint or a SQuAD fine-tuning run's "
                    "best_model")


class SquadEvaluator:
  """Scores a span model on fixed SQuAD windows under head gates and segment removal, in exact
  match and F1 (``heads_jax.data.squad_eval``; the n-best answer of each question over its
  windows): the interface of `Evaluator` that `heads_jax.ablation.ablate` uses (``evaluate``,
  ``num_layers``, ``num_heads``, ``task``, ``data``, ``mesh``, ``metric_columns``).

  Windows are batched once (``batch_size`` rounded up to the number of devices; padding rows
  have no attention and are dropped), put on the ``data`` mesh and reused; one jitted call per
  batch returns its start and end logits ``[b, q]``.
  """

  metric_columns = SQUAD_METRICS

  def __init__(self, model, data: SquadEvalData, *, batch_size: int = 32, mesh=None,
               n_best_size: int | None = None, max_answer_length: int | None = None):
    from heads_jax.data import squad_eval
    from heads_jax.training.squad import window_batches
    check_span_model(model)
    cfg = model.config
    if data.features.input_ids.shape[1] > cfg.max_position_embeddings:
      raise UserError(f"windows of {data.features.input_ids.shape[1]} positions exceed the "
                      f"model's {cfg.max_position_embeddings}; lower --max-length")
    if int(data.features.input_ids.max()) >= cfg.vocab_size:
      raise UserError("the data has token ids beyond the model's vocabulary: encode it with the "
                      "model's own tokenizer")
    self.data, self.task = data, data.task
    self.num_layers, self.num_heads = cfg.num_layers, cfg.num_heads
    self.n_best_size = n_best_size or squad_eval.N_BEST_SIZE
    self.max_answer_length = max_answer_length or squad_eval.MAX_ANSWER_LENGTH
    self.mesh = data_mesh() if mesh is None else mesh
    local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
    multiple = max(1, len(local))
    self.graphdef, state = nnx.split(model)
    self.state = replicate(state, self.mesh)
    inputs = {k: getattr(data.features, k) for k in glue_batches.TEXT_ARRAYS}
    host = list(window_batches(inputs, batch_size, multiple))
    self.rows = [rows for _, rows in host]
    self.batches = [shard_batch({k: b[k] for k in glue_batches.TEXT_ARRAYS}, self.mesh)
                    for b, _ in host]
    graphdef = self.graphdef

    def run(state, batch, gate, removal, gate_mode, renormalise):
      out = gated_forward(graphdef, state, batch, gate, removal, gate_mode, renormalise)
      return jnp.stack([out["start_logits"], out["end_logits"]], -1).astype(jnp.float32)

    self._run = jax.jit(run, static_argnames=("gate_mode", "renormalise"))
    self.last_predictions: dict | None = None

  def logits(self, head_gate=None, *, gate_mode: str = "remove", segment_removal=None,
             renormalise: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(start, end)`` float32 ``[n, q]`` logits of every window."""
    if gate_mode not in GATE_MODES:
      raise UserError(f"gate mode must be one of {GATE_MODES}, got {gate_mode!r}")
    L, H = self.num_layers, self.num_heads
    gate = np.ones((L, H), np.float32) if head_gate is None else np.asarray(head_gate, np.float32)
    if gate.shape != (L, H):
      raise ValueError(f"head_gate must be [layers, heads] = {(L, H)}, got {gate.shape}")
    gate = replicate(jnp.asarray(gate), self.mesh)
    removal = None
    if segment_removal is not None:
      removal = np.asarray(segment_removal, np.float32)
      if removal.shape != (L, H, 2):
        raise ValueError(f"segment_removal must be [layers, heads, 2] = {(L, H, 2)}, got "
                         f"{removal.shape}")
      removal = replicate(jnp.asarray(removal), self.mesh)
    n, q = self.data.features.input_ids.shape
    out = np.zeros((n, q, 2), np.float32)
    for batch, rows in zip(self.batches, self.rows):
      p = np.asarray(jax.device_get(self._run(self.state, batch, gate, removal,
                                              gate_mode=gate_mode, renormalise=bool(renormalise))))
      keep = rows >= 0
      out[rows[keep]] = p[keep]
    return out[..., 0], out[..., 1]

  def evaluate(self, head_gate=None, *, gate_mode: str = "remove", segment_removal=None,
               renormalise: bool = False) -> dict:
    """``exact_match`` and ``f1`` (fractions; the official SQuAD scores / 100) and ``n``
    (questions) with ``head_gate`` ``[l, h]`` in ``gate_mode`` and the optional
    ``segment_removal`` ``[l, h, 2]``; the answers are kept in ``last_predictions``."""
    from heads_jax.training.squad import score_logits
    start, end = self.logits(head_gate, gate_mode=gate_mode, segment_removal=segment_removal,
                             renormalise=renormalise)
    preds, scores = score_logits(self.data.features, start, end, n_best_size=self.n_best_size,
                                 max_answer_length=self.max_answer_length,
                                 version_2=self.data.version_2)
    self.last_predictions = preds
    return {"exact_match": scores["exact_match"] / 100, "f1": scores["f1"] / 100,
            "n": int(scores["total"])}


def load_span_model(path, dtype: str | None = None):
  """``(model, tokenizer)`` of a SQuAD (question-answering) model directory or hub id."""
  model, tokenizer = load_model(path, head="auto", dtype=dtype)
  check_span_model(model)
  return model, tokenizer
