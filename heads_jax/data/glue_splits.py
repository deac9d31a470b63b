"""Which GLUE rows a job trains on, evaluates on and analyses: the one split module, shared by
fine-tuning (`heads_jax.training.finetune`), the reproduce pipeline and the ablation.

* ``load_split``: one split of a task from GLUE TSV folders or TFDS (the task table,
  `heads_jax.data.glue.TASKS`, says the columns: adding a task there is enough here).
* ``load_task_splits``: fine-tuning's labelled train and eval examples. With
  ``holdout_fraction > 0`` the train split is shuffled with ``holdout_seed`` and cut: the first
  ``round(holdout_fraction * n)`` rows become the eval set, the rest the train set. A task
  without its train split (the shared copy of QNLI has only dev and test; QQP only a 23K-row
  ``train_subset``) is an error unless ``fallback_split`` names the split to cut instead (a
  holdout of it, 10% unless ``holdout_fraction`` says otherwise): training on a part of a split
  that is otherwise evaluated is never silent. The returned note says which rows were used.
* ``plan_rows``: the reproduce pipeline's three roles (train, eval, analysis) over the splits a
  config names; roles sharing a split get disjoint rows (``check_disjoint``).
* ``select_rows`` / ``row_ranges`` / ``expand_ranges``: rows by their ``idx``, and ``idx`` sets
  as ``[[start, end), ...]`` runs (how run-level files record them).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from heads_jax.data import glue
from heads_jax.errors import UserError

log = logging.getLogger(__name__)

ROLES = ("train", "eval", "analysis")


def load_split(task: str, split: str, *, source: str = "tsv", glue_dir=None, tfds_data_dir=None,
               max_examples: int | None = None) -> list:
  """The ``GlueExample`` rows of one split; ``source``: ``"tsv"`` (GLUE TSV folders under
  ``glue_dir``; FileNotFoundError when the split is missing) or ``"tfds"``."""
  info = glue.task_info(task)
  if source == "tfds":
    return glue.load_glue_tfds(info.name, split, data_dir=tfds_data_dir or None,
                               max_examples=max_examples or None)
  if source == "tsv":
    return glue.load_glue_tsv(glue_dir, info.name, split, max_examples=max_examples or None)
  raise ValueError(f"data.source must be 'tsv' or 'tfds', got {source!r}")


def resolve_source(task: str, source: str, glue_dir, train_split: str) -> str:
  """``tsv`` or ``tfds`` (``auto``: tsv when ``glue_dir`` holds the task's ``train_split``)."""
  if source in ("tsv", "tfds"):
    return source
  if source != "auto":
    raise UserError(f"data source of {task} must be auto, tsv or tfds, got {source!r}")
  try:
    glue.tsv_path(glue_dir, task, train_split)
    return "tsv"
  except FileNotFoundError:
    return "tfds"


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
    return load_split(info.name, split, source=source, glue_dir=glue_dir,
                      tfds_data_dir=tfds_data_dir, max_examples=max_examples)

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
      raise UserError(
          f"data.holdout_fraction={holdout} of the {n} rows of GLUE {info.name} {used_split} "
          f"under {glue_dir} leaves {'no eval' if k == 0 else 'no train'} rows: "
          + ("the split is empty: check the file" if n == 0 else
             f"choose a fraction between {1 / n:.2g} and {1 - 1 / n:.2g}"))
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


def row_ranges(idx) -> list[list[int]]:
  """Sorted integers as ``[[start, end), ...]`` runs."""
  out = []
  for i in sorted(int(x) for x in idx):
    if out and out[-1][1] == i:
      out[-1][1] = i + 1
    else:
      out.append([i, i + 1])
  return out


def expand_ranges(ranges) -> set[int]:
  """The integers of ``[[start, end), ...]`` runs."""
  return {i for a, b in ranges for i in range(a, b)}


def select_rows(examples, idx) -> list:
  """The examples whose ``idx`` is in ``idx`` (in their order); ValueError when some are absent."""
  wanted = set(int(i) for i in idx)
  out = [e for e in examples if e.idx in wanted]
  if len(out) != len(wanted):
    raise ValueError(f"{len(wanted) - len(out)} of the {len(wanted)} requested rows are not in "
                     "the split")
  return out


def plan_rows(task: str, split_rows: dict, splits: dict, *, test_sequences: int,
              eval_fraction: float, seed: int, max_eval: int = 0, max_train: int = 0,
              partition_shared: bool = False, where: str = "config.data") -> dict:
  """Which rows of which split each role gets: ``{role: (split, [positions])}``.

  ``split_rows``: ``{split: number of rows}``; ``splits``: ``{role: split}``. Roles on one
  split get disjoint rows (analysis: the first ``test_sequences``; eval: a seeded
  ``eval_fraction`` of the rest; train: the remainder); that needs ``partition_shared``. Caps:
  ``max_eval`` (on a shared split the rows it leaves out go to training), ``max_train`` (the
  first rows after the cut); 0 means no cap. ``where`` names the settings in error messages.
  """
  by_split: dict[str, list[str]] = {}
  for role in ROLES:
    by_split.setdefault(splits[role], []).append(role)
  shared = {s: r for s, r in by_split.items() if len(r) > 1}
  if shared and not partition_shared:
    s, r = next(iter(shared.items()))
    raise UserError(f"{where}.{task}: {' and '.join(r)} both read the {s} split; fine-tuning "
                    f"never trains on rows that are evaluated or analysed, so set "
                    f"--{where}.partition_shared_splits=True to give them disjoint rows of "
                    f"{s}, or name different splits")
  n_test = int(test_sequences)
  if n_test <= 0:
    raise UserError(f"config.test_sequences must be positive, got {n_test}")
  plan = {}
  for split, roles in by_split.items():
    rest = list(range(split_rows[split]))
    if "analysis" in roles:
      plan["analysis"] = (split, rest[:n_test])
      rest = rest[n_test:]
    if "eval" in roles and "train" in roles:
      if not 0.0 < eval_fraction < 1.0:
        raise UserError(f"{where}.eval_fraction must lie in (0, 1), got {eval_fraction}")
      order = np.random.default_rng([int(seed), sum(map(ord, task))]).permutation(len(rest))
      k = int(round(eval_fraction * len(rest)))
      if max_eval > 0:  # rows the cap leaves out of the evaluation go to training
        k = min(k, int(max_eval))
      plan["eval"] = (split, sorted(rest[i] for i in order[:k]))
      plan["train"] = (split, sorted(rest[i] for i in order[k:]))
    elif "eval" in roles:
      plan["eval"] = (split, rest)
    elif "train" in roles:
      plan["train"] = (split, rest)
  if max_eval > 0:
    plan["eval"] = (plan["eval"][0], plan["eval"][1][: int(max_eval)])
  if max_train > 0:
    plan["train"] = (plan["train"][0], plan["train"][1][: int(max_train)])
  for role in ("train", "eval"):
    if not plan[role][1]:
      raise UserError(f"GLUE {task}: no rows left for {role} in split {plan[role][0]} "
                      f"({split_rows[plan[role][0]]} rows; test_sequences {n_test})")
  check_disjoint(task, plan)
  return plan


def check_disjoint(task: str, plan: dict) -> None:
  """Raises when two roles of ``plan`` read a row of the same split."""
  for i, a in enumerate(ROLES):
    for b in ROLES[i + 1:]:
      if plan[a][0] == plan[b][0] and set(plan[a][1]) & set(plan[b][1]):
        raise AssertionError(f"{task}: {a} and {b} overlap in split {plan[a][0]}")


def _clean_text(s: str) -> str:
  return re.sub(r"[\t\r\n]+", " ", s)


def write_glue_tsv(path: Path, task: str, examples) -> Path:
  """Writes ``examples`` as a GLUE TSV that `glue.load_glue_tsv` reads back (label column only
  when every row has a label)."""
  info = glue.task_info(task)
  labelled = all(e.label is not None for e in examples)
  header = ([info.tsv_label_column] if labelled else []) + list(info.tsv_text_columns)
  lines = ["\t".join(header)]
  for e in examples:
    texts = [e.text_a] + ([e.text_b] if info.is_pair else [])
    row = ([info.tsv_label_values[e.label]] if labelled else []) + [_clean_text(t) for t in texts]
    lines.append("\t".join(row))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def cut_task(task: str, rows: dict, plan: dict, folder: Path, *, source: str,
             origin: str) -> dict:
  """The rows of each role of ``task`` as ``plan`` (`plan_rows`) cuts ``rows`` (``{split:
  examples}``): writes the analysis rows as a GLUE TSV (``folder/analysis.tsv``, a data spec the
  analysis reads) and returns where every role's rows come from (``roles``: split, row count,
  ``idx`` ranges, ``labelled``; ``shared_splits``; ``describe``: one sentence)."""
  folder = Path(folder)
  out = {"task": task, "source": source, "dir": str(folder), "origin": origin, "roles": {}}
  for role in ROLES:
    split, positions = plan[role]
    examples = [rows[split][i] for i in positions]
    if role != "analysis" and any(e.label is None for e in examples):
      raise UserError(f"GLUE {task}: the {split} split has no labels; it cannot be used for "
                      f"{role} (set config.data.{task}.{role} to a labelled split)")
    total = len(rows[split])
    out["roles"][role] = {
        "split": split, "rows": len(examples), "split_rows": total,
        "whole_split": len(examples) == total,
        "idx": row_ranges(e.idx for e in examples),
        "labelled": all(e.label is not None for e in examples)}
    if role == "analysis":
      out["roles"][role]["file"] = str(write_glue_tsv(folder / "analysis.tsv", task, examples))
  shared = {}
  for role in ROLES:
    shared.setdefault(plan[role][0], []).append(role)
  out["shared_splits"] = {s: r for s, r in shared.items() if len(r) > 1}
  out["describe"] = describe_splits(out)
  return out


def describe_splits(task_out: dict) -> str:
  """One sentence per task: which rows each stage used (``task_out``: `cut_task`'s)."""
  r = task_out["roles"]
  src = "TFDS" if task_out["source"] == "tfds" else "local GLUE TSV"

  def part(role, verb):
    x = r[role]
    whole = "all" if x["whole_split"] else f"{x['rows']:,} of the {x['split_rows']:,}"
    return f"{verb} {whole} rows of {x['split']}"
  text = (f"{src}: {part('train', 'fine-tuned on')}, {part('eval', 'evaluated on')}, "
          f"{part('analysis', 'analysed the first')}".replace("analysed the first all", "analysed all"))
  if task_out["shared_splits"]:
    text += ("; " + "; ".join(f"{' / '.join(v)} share {k} with disjoint rows"
                              for k, v in task_out["shared_splits"].items()))
  return text
