"""GLUE tasks MRPC, QQP, SST-2, QNLI, MNLI, RTE, CoLA, STS-B and WNLI from local GLUE TSV
folders or through TFDS.

Labels follow TFDS ``glue/<task>``: MRPC not_equivalent=0 / equivalent=1, QQP
not_duplicate=0 / duplicate=1, SST-2 negative=0 / positive=1, QNLI entailment=0 /
not_entailment=1, MNLI entailment=0 / neutral=1 / contradiction=2, RTE entailment=0 /
not_entailment=1, CoLA unacceptable=0 / acceptable=1, WNLI not_entailment=0 / entailment=1;
STS-B is a regression (``label`` the float similarity score, 0-5). Test splits have no labels
(``label=None``). ``idx`` is the 0-based data row of the file (as TFDS numbers it).

Splits: ``dev`` (alias ``validation``) is the dev set; MNLI has two, ``dev_matched`` (what
``dev`` means for MNLI) and ``dev_mismatched`` (TFDS ``validation_matched`` /
``validation_mismatched``), and ``test_matched`` / ``test_mismatched``.

CoLA's train and dev TSVs have no header line: four columns (source, label, the original
judgement mark, sentence), read by position (``GlueTask.tsv_positions``); its test TSV has one.
"""

import csv
import dataclasses
import itertools
import sys
import warnings
from pathlib import Path

from heads_jax.data.utf8 import not_utf8


@dataclasses.dataclass(frozen=True)
class GlueExample:
  """One GLUE example: a single text (``text_b`` None) or a pair; ``label`` None if unlabelled
  (a class id, or the float score of a regression task: STS-B)."""
  text_a: str
  text_b: str | None
  label: int | float | None
  idx: int


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """Per-task metadata. Also readable as a mapping: ``TASKS["mrpc"]["num_labels"]``."""
  name: str                       # TFDS config name: "mrpc", "qqp", "sst2", "qnli", ...
  dir_name: str                   # folder in a GLUE TSV root: "MRPC", "QQP", "SST-2", "QNLI", ...
  num_labels: int                 # 1 for a regression (STS-B)
  label_names: tuple[str, ...]    # label id -> name (TFDS ClassLabel names); () for a regression
  # "accuracy" (classification), "f1" (positive class 1: mrpc, qqp), "matthews" (cola),
  # "pearson" and "spearman" (stsb); the last is the one fine-tuning selects the best model by
  metrics: tuple[str, ...]
  text_keys: tuple[str, ...]      # TFDS feature names of text_a (and text_b)
  tsv_text_columns: tuple[str, ...]  # TSV header columns of text_a (and text_b)
  tsv_label_column: str
  tsv_label_values: tuple[str, ...]  # TSV label strings, position = label id; () for a regression
  # a TSV without a header line (CoLA train/dev): (text column positions, label position,
  # number of fields); None: every TSV of the task has a header
  tsv_positions: tuple | None = None
  # split name -> TSV file stem / TFDS split where they differ from the common ones (MNLI)
  tsv_splits: tuple[tuple[str, str], ...] = ()
  tfds_splits: tuple[tuple[str, str], ...] = ()

  @property
  def is_pair(self) -> bool:
    return len(self.text_keys) == 2

  @property
  def is_regression(self) -> bool:
    return self.num_labels == 1

  def __getitem__(self, key):
    return getattr(self, key)


TASKS = {
    "mrpc": GlueTask("mrpc", "MRPC", 2, ("not_equivalent", "equivalent"), ("accuracy", "f1"),
                     ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality", ("0", "1")),
    "qqp": GlueTask("qqp", "QQP", 2, ("not_duplicate", "duplicate"), ("accuracy", "f1"),
                    ("question1", "question2"), ("question1", "question2"), "is_duplicate",
                    ("0", "1")),
    "sst2": GlueTask("sst2", "SST-2", 2, ("negative", "positive"), ("accuracy",), ("sentence",),
                     ("sentence",), "label", ("0", "1")),
    "qnli": GlueTask("qnli", "QNLI", 2, ("entailment", "not_entailment"), ("accuracy",),
                     ("question", "sentence"), ("question", "sentence"), "label",
                     ("entailment", "not_entailment")),
    "mnli": GlueTask("mnli", "MNLI", 3, ("entailment", "neutral", "contradiction"), ("accuracy",),
                     ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
                     ("entailment", "neutral", "contradiction"),
                     tsv_splits=(("dev", "dev_matched"), ("validation", "dev_matched"),
                                 ("validation_matched", "dev_matched"),
                                 ("validation_mismatched", "dev_mismatched"),
                                 ("test", "test_matched")),
                     tfds_splits=(("dev", "validation_matched"),
                                  ("validation", "validation_matched"),
                                  ("dev_matched", "validation_matched"),
                                  ("dev_mismatched", "validation_mismatched"),
                                  ("test", "test_matched"))),
    "rte": GlueTask("rte", "RTE", 2, ("entailment", "not_entailment"), ("accuracy",),
                    ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                    ("entailment", "not_entailment")),
    "cola": GlueTask("cola", "CoLA", 2, ("unacceptable", "acceptable"), ("accuracy", "matthews"),
                     ("sentence",), ("sentence",), "label", ("0", "1"),
                     tsv_positions=((3,), 1, 4)),
    "stsb": GlueTask("stsb", "STS-B", 1, (), ("pearson", "spearman"),
                     ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", ()),
    "wnli": GlueTask("wnli", "WNLI", 2, ("not_entailment", "entailment"), ("accuracy",),
                     ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", ("0", "1")),
}

_ALIASES = {"sst-2": "sst2", "sst_2": "sst2", "sts-b": "stsb", "sts_b": "stsb"}
_SPLITS = {"validation": "dev", "dev": "dev", "train": "train", "test": "test"}


def task_info(task: str) -> GlueTask:
  """The `GlueTask` of a task name (case-insensitive; ``SST-2`` and ``sst2`` both work)."""
  key = _ALIASES.get(task.lower(), task.lower())
  if key not in TASKS:
    raise ValueError(f"unknown GLUE task {task!r}: supported tasks are {', '.join(TASKS)}")
  return TASKS[key]


def tsv_path(path_dir, task: str, split: str = "dev") -> Path:
  """The TSV file of a task and split: ``path_dir`` is a GLUE root (holding ``MRPC/`` ...) or
  the task folder itself; ``split`` is ``train``, ``dev`` (alias ``validation``), ``test`` or
  any other file stem there (e.g. ``train_subset``)."""
  info = task_info(task)
  root = Path(path_dir)
  candidates = [root / info.dir_name, root / info.dir_name.lower(), root / info.name, root]
  stem = dict(info.tsv_splits).get(split) or _SPLITS.get(split, split)
  for folder in candidates:
    if (folder / f"{stem}.tsv").is_file():
      return folder / f"{stem}.tsv"
  raise FileNotFoundError(
      f"no {stem}.tsv for GLUE task {info.name} under {root} (looked in "
      f"{', '.join(str(c) for c in dict.fromkeys(candidates))}); pass the GLUE root folder "
      f"(holding {info.dir_name}/) or the task folder, and a split that exists there")


def _label_id(info: GlueTask, value: str) -> int | float:
  value = value.strip()
  if info.is_regression:
    return float(value)
  if value in info.tsv_label_values:
    return info.tsv_label_values.index(value)
  if value in info.label_names:
    return info.label_names.index(value)
  raise ValueError(f"label {value!r} is not one of {info.tsv_label_values}")


def load_glue_tsv(path_dir, task: str, split: str = "dev", max_examples: int | None = None,
                  bad_rows: str = "warn") -> list[GlueExample]:
  """Reads a GLUE TSV split (standard column layout, header line, UTF-8 with or without BOM).

  Columns are found by header name, so test files (``index`` first, no label) work too.
  ``bad_rows``: a row with the wrong number of fields or an unknown label is skipped with a
  warning ("warn", as TFDS and the GLUE processors skip them; the QQP subset has one), skipped
  silently ("skip"), or raises ValueError naming file and line ("error").
  """
  if bad_rows not in ("warn", "skip", "error"):
    raise ValueError(f"bad_rows must be 'warn', 'skip' or 'error', got {bad_rows!r}")
  info = task_info(task)
  path = tsv_path(path_dir, task, split)
  try:
    examples, skipped = _read_glue_tsv(path, info, max_examples, bad_rows)
  except UnicodeDecodeError:
    raise not_utf8(path) from None
  if skipped and bad_rows == "warn":
    warnings.warn(f"{path}: skipped {len(skipped)} malformed row(s) at line(s) "
                  f"{', '.join(map(str, skipped[:10]))}{' ...' if len(skipped) > 10 else ''}",
                  stacklevel=2)
  return examples


def _read_glue_tsv(path, info: GlueTask, max_examples, bad_rows):
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
  examples, skipped = [], []
  with open(path, encoding="utf-8-sig", newline="") as f:
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None:
      raise ValueError(f"{path} is empty: expected a GLUE TSV header line")
    header = [h.strip() for h in header]
    missing = [c for c in info.tsv_text_columns if c not in header]
    rows, first = reader, 2
    if missing and info.tsv_positions is not None:  # no header line (CoLA train/dev): by position
      text_cols, label_col, n_fields = info.tsv_positions
      text_cols = list(text_cols)
      rows, first = itertools.chain([header], reader), 1
    elif missing:
      raise ValueError(f"{path}: header {header} lacks the column(s) {missing} of GLUE "
                       f"{info.name} ({info.tsv_text_columns})")
    else:
      n_fields = len(header)
      text_cols = [header.index(c) for c in info.tsv_text_columns]
      label_col = header.index(info.tsv_label_column) if info.tsv_label_column in header else None
    for n, row in enumerate(rows):
      if max_examples is not None and len(examples) >= max_examples:
        break
      lineno = n + first
      try:
        if len(row) != n_fields:
          raise ValueError(f"expected {n_fields} tab-separated fields, found {len(row)}")
        label = _label_id(info, row[label_col]) if label_col is not None else None
      except ValueError as e:
        if bad_rows == "error":
          raise ValueError(f"{path}, line {lineno}: {e}") from None
        skipped.append(lineno)
        continue
      texts = [row[c] for c in text_cols]
      examples.append(GlueExample(texts[0], texts[1] if len(texts) > 1 else None, label, n))
  return examples, skipped


def _as_str(value) -> str:
  if hasattr(value, "item") and getattr(value, "shape", None) == ():
    value = value.item()
  if isinstance(value, bytes):
    return value.decode("utf-8")
  return str(value)


def glue_example_from_record(task: str, record: dict) -> GlueExample:
  """Converts one TFDS ``glue/<task>`` record (dict of numpy scalars / str / bytes)."""
  info = task_info(task)
  texts = [_as_str(record[k]) for k in info.text_keys]
  label = float(record["label"]) if info.is_regression else int(record["label"])
  return GlueExample(texts[0], texts[1] if len(texts) > 1 else None,
                     None if label < 0 else label, int(record["idx"]))


def tfds_split(task: str, split: str) -> str:
  """TFDS's name of a GLUE task's split (``dev``: ``validation``, MNLI's ``validation_matched``)."""
  return dict(task_info(task).tfds_splits).get(split) or {"dev": "validation"}.get(split, split)


def load_glue_tfds(task: str, split: str = "validation", data_dir=None,
                   max_examples: int | None = None) -> list[GlueExample]:
  """Reads ``glue/<task>`` through ``tfds.data_source`` (array_record, no TensorFlow needed).

  The dataset must already be prepared in ``data_dir`` (or the TFDS default folder); nothing
  is downloaded here unless TFDS itself does so. Test splits give ``label=None``.
  """
  info = task_info(task)
  # Optional heavy dependency (TensorFlow Datasets), imported only when TFDS data is asked for.
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.glue  # noqa: F401  (registers the glue builder)
  split = tfds_split(task, split)
  try:
    source = tfds.data_source(f"glue/{info.name}", split=split, data_dir=data_dir,
                              download=False)
  except Exception as e:  # TFDS raises assorted errors for a missing / unprepared dataset
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
    raise ValueError(
        f"cannot read TFDS glue/{info.name} split {split!r} from "
        f"{data_dir or 'the TFDS default data folder'} ({first_line}). Prepare it first "
        f"(tfds build glue/{info.name} --file_format=array_record), or read the GLUE TSV "
        f"files with load_glue_tsv / spec glue-tsv:DIR/{info.name}") from e
  n = len(source) if max_examples is None else min(len(source), max_examples)
  return [glue_example_from_record(info.name, source[i]) for i in range(n)]
