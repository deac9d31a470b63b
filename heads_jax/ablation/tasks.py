"""The task of a fine-tuned model and its evaluation data, for the causal jobs (ablation,
attribution, patching): what a classifier directory says it was fine-tuned on, the refusal of
data of another task, and the model, data and evaluator loaded together (host side; the
evaluation itself is `heads_jax.ablation.evaluate`)."""

from __future__ import annotations

from pathlib import Path

from heads_jax import runfiles
from heads_jax.ablation import evaluate
from heads_jax.data.specs import parse_spec
from heads_jax.errors import UserError
from heads_jax.training.rundir import RunDir


def load_evaluation(config):
  """``(model, tokenizer, data, evaluator)`` of a causal job's ``config`` (its fields model,
  data, task, dtype, max_length, doc_stride, max_examples, batch_size, finetune_data): a GLUE
  classifier on GLUE data, or a SQuAD span model on ``squad:`` data (windows of
  ``--max-length``; exact match and F1)."""
  if evaluate.is_squad_spec(config.data):
    model, tokenizer = evaluate.load_span_model(config.model, dtype=config.dtype)
    model.config.check_max_length(config.max_length)
    data = evaluate.load_squad_eval_data(config.data, tokenizer, max_length=config.max_length,
                                         doc_stride=config.doc_stride,
                                         max_examples=config.max_examples)
    return model, tokenizer, data, evaluate.SquadEvaluator(model, data,
                                                           batch_size=config.batch_size)
  model, tokenizer = evaluate.load_classifier(config.model, dtype=config.dtype)
  model.config.check_max_length(config.max_length)
  rows = evaluate.eval_rows_from_finetune(config.finetune_data) if config.finetune_data else None
  data = evaluate.load_eval_data(config.data, tokenizer, task=config.task, max_length=config.max_length,
                                 max_examples=config.max_examples, rows=rows)
  return model, tokenizer, data, evaluate.Evaluator(model, data, batch_size=config.batch_size)



def task_name(config) -> str:
  """The task of ``config.data`` (``config.task`` over the spec's), from the spec alone (nothing loaded)."""
  if evaluate.is_squad_spec(config.data):
    return evaluate.SquadTask().name
  try:
    spec = parse_spec(config.data)
  except ValueError as e:
    raise UserError(str(e)) from None
  return config.task or spec.task or "?"



def classifier_task(model_dir) -> tuple[str | None, tuple[str, ...] | None]:
  """What a classifier directory says of the task it was fine-tuned on: ``(task, label
  names)``, from the fine-tuning run it was exported into (its job marker, `runfiles.JOB_FILE`,
  one folder up) and its ``id2label`` (heads_jax.json or a Hugging Face config.json; generic
  ``LABEL_i`` names say nothing). Either is None when unknown."""
  p = Path(str(model_dir))
  task = None
  if not str(model_dir).startswith(("gs://", "s3://")) and p.is_dir():
    job = runfiles.read_job(p.parent) if (p.parent / runfiles.JOB_FILE).is_file() else None
    if job and job.get("kind") == "finetuning":
      task = job.get("task")
    for name in ("heads_jax.json", "config.json"):
      doc = runfiles.read_json(p / name, missing_ok=True) if (p / name).is_file() else None
      id2label = (doc or {}).get("id2label") if isinstance(doc, dict) else None
      if id2label:
        names = tuple(str(id2label[k]) for k in sorted(id2label, key=lambda k: int(k)))
        if not all(n.upper() == f"LABEL_{i}" for i, n in enumerate(names)):
          return task, names
        break
  return task, None


def check_classifier_task(model_dir, task) -> None:
  """Refuses (UserError) a classifier fine-tuned on another task than the data's ``task`` (a
  `glue.GlueTask`), when the model directory says which (`classifier_task`); before any
  evaluation."""
  if getattr(task, "label_names", None) is None:
    return
  trained, names = classifier_task(model_dir)
  if trained is not None and trained != task.name:
    raise UserError(f"the classifier {model_dir} was fine-tuned on {trained}, but the data is "
                    f"{task.name}: its scores would mean nothing; pass --data of {trained}, or a "
                    f"classifier fine-tuned on {task.name}")
  if names is not None and task.label_names and names != tuple(task.label_names):
    raise UserError(f"the classifier {model_dir} predicts the labels {', '.join(names)}, but "
                    f"{task.name}'s labels are {', '.join(task.label_names)}: it was fine-tuned on "
                    "another task; pass --data of its task, or a classifier of this one")



def finetune_data_file(path) -> Path:
  """The data.json that ``--finetune-data`` names (the file, or a fine-tuning run's)."""
  path = Path(path)
  return Path(str(RunDir(path).data_file)) if path.is_dir() else path


def split_rows(data: evaluate.EvalData, count: int | None):
  """``(first, rest)``: the first ``count`` rows of ``data`` (default: half, at least 1) and the
  rows after them (None when none are left), as `evaluate.EvalData`: attribution, patching and
  the importance the pruning orders come from use the first, the pruning curves the rest."""
  n = len(data)
  count = max(1, n // 2) if count is None else int(count)
  if not 1 <= count <= n:
    raise UserError(f"--attribution-examples {count}: give at least 1 and at most the {n} "
                    "evaluation rows")

  def part(sl, what):
    rows = None if data.rows is None else data.rows[sl]
    return evaluate.EvalData(data.input_ids[sl], data.attention_mask[sl], data.token_type_ids[sl],
                             data.labels[sl], data.task, f"{data.name}, {what}", rows)
  first = part(slice(0, count), f"rows 1-{count}")
  rest = part(slice(count, n), f"rows {count + 1}-{n} (held out)") if count < n else None
  return first, rest
