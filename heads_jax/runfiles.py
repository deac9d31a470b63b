"""The run-level files of the pipelines (`heads_jax.pipelines`): the one place that names,
writes and reads them (no jax; the analysis directory's own files are `heads_jax.contract`'s).

Every file here is JSON, written atomically (a temporary file renamed over the target), so a
reader sees the previous version or the new one, never half of one.

Stage engine (`heads_jax.pipelines.engine`), under ``RUN/stages/``:

* ``<stage>/<unit>.started.json``: ``{"key", "started"}``, written before a unit runs;
* ``<stage>/<unit>.json``: the finish marker ``{"key", "outputs", "started", "finished",
  "seconds"}``, written last, after every output of the unit;
* ``<stage>.json``: ``{"stage", "finished", "seconds", "ran", "reused"}`` of the stage.

Reproduce (`heads_jax.pipelines.reproduce`): ``reproduce_config.json``, ``data/splits.json``
(`SPLITS_JSON`), ``pretrained/pretrained.json``, ``finetune/<task>/best.json`` (`BEST_JSON`),
``analysis/analyses.json`` (`ANALYSES_JSON`).

Demo (`heads_jax.pipelines.demo`): ``demo.json`` (what ran, where, how long).

Compare (`heads_jax.pipelines.compare`): ``attention_similarity.csv`` (`write_table`; the
comparison's own tables are `heads_jax.contract.write_comparison`'s).

Ablation (`heads_jax.pipelines.ablate`): ``ablation.json`` (`ABLATION_JSON`), its tables
``<stem>.csv`` (`ABLATION_TABLES`; `write_table`) and ``importance.npy`` (`write_array`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

STAGES_DIR = "stages"
STARTED_SUFFIX = ".started.json"
REPRODUCE_CONFIG_JSON = "reproduce_config.json"
SPLITS_JSON = "splits.json"
PRETRAINED_JSON = "pretrained.json"
BEST_JSON = "best.json"
ANALYSES_JSON = "analyses.json"
DEMO_JSON = "demo.json"
ABLATION_JSON = "ablation.json"
ABLATION_TABLES = ("ablation.csv", "segment_ablation.csv", "importance.csv", "pruning.csv",
                   "pruning_summary.csv")


def write_json(path, data) -> Path:
  """Writes ``data`` as JSON to ``path`` atomically (parents created); returns ``path``."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(data, indent=2, default=str))
  tmp.replace(path)
  return path


def read_json(path, missing_ok: bool = False):
  """The JSON document at ``path``; None when absent and ``missing_ok``."""
  path = Path(path)
  if missing_ok and not path.is_file():
    return None
  return json.loads(path.read_text())


def canonical(obj) -> str:
  """A key as a canonical string (sorted keys; non-JSON values as ``str``), for comparison."""
  return json.dumps(obj, sort_keys=True, default=str)


def unit_file_name(unit: str) -> str:
  """A unit name as a file name (``/`` and other odd characters as ``_``)."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", unit)


class Markers:
  """The stage and unit markers of one run directory (``RUN/stages``)."""

  def __init__(self, workdir):
    self.root = Path(workdir) / STAGES_DIR

  def unit_path(self, stage: str, unit: str, started: bool = False) -> Path:
    return self.root / stage / (unit_file_name(unit) + (STARTED_SUFFIX if started else ".json"))

  def read_unit(self, stage: str, unit: str, started: bool = False) -> dict | None:
    return read_json(self.unit_path(stage, unit, started), missing_ok=True)

  def write_unit(self, stage: str, unit: str, data: dict, started: bool = False) -> None:
    write_json(self.unit_path(stage, unit, started), data)

  def read_stage(self, stage: str) -> dict | None:
    return read_json(self.root / f"{stage}.json", missing_ok=True)

  def write_stage(self, stage: str, data: dict) -> None:
    write_json(self.root / f"{stage}.json", data)

  def clear(self, stage: str) -> None:
    """Removes every marker of ``stage``."""
    shutil.rmtree(self.root / stage, ignore_errors=True)
    (self.root / f"{stage}.json").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------
# reproduce


def splits_path(workdir) -> Path:
  return Path(workdir) / "data" / SPLITS_JSON


def pretrained_path(workdir) -> Path:
  return Path(workdir) / "pretrained" / PRETRAINED_JSON


def best_path(workdir, task: str) -> Path:
  return Path(workdir) / "finetune" / task / BEST_JSON


def analyses_path(workdir) -> Path:
  return Path(workdir) / "analysis" / ANALYSES_JSON


def write_reproduce_config(workdir, config: dict) -> Path:
  return write_json(Path(workdir) / REPRODUCE_CONFIG_JSON, config)


def read_reproduce_config(workdir) -> dict | None:
  return read_json(Path(workdir) / REPRODUCE_CONFIG_JSON, missing_ok=True)


def write_splits(workdir, splits: dict) -> Path:
  return write_json(splits_path(workdir), splits)


def read_splits(workdir) -> dict:
  return read_json(splits_path(workdir))


def write_pretrained(workdir, info: dict) -> Path:
  return write_json(pretrained_path(workdir), info)


def write_best(workdir, task: str, summary: dict) -> Path:
  return write_json(best_path(workdir, task), summary)


def read_best(workdir, task: str) -> dict:
  return read_json(best_path(workdir, task))


def write_analyses(workdir, analyses: dict) -> Path:
  return write_json(analyses_path(workdir), analyses)


def read_analyses(workdir) -> dict:
  return read_json(analyses_path(workdir))


# ------------------------------------------------------------------------------------------------
# demo


def write_demo(out, parts: dict) -> Path:
  return write_json(Path(out) / DEMO_JSON, parts)


def read_demo(out) -> dict | None:
  return read_json(Path(out) / DEMO_JSON, missing_ok=True)


# ------------------------------------------------------------------------------------------------
# ablation


def write_table(out, stem: str, table) -> Path:
  """A pandas table as ``out/<stem>.csv`` (no index), written atomically."""
  path = Path(out) / f"{stem}.csv"
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  table.to_csv(tmp, index=False)
  tmp.replace(path)
  return path


def write_array(out, stem: str, array) -> Path:
  """A numpy array as ``out/<stem>.npy``."""
  path = Path(out) / f"{stem}.npy"
  path.parent.mkdir(parents=True, exist_ok=True)
  np.save(path, np.asarray(array))
  return path


def write_ablation_json(out, info: dict) -> Path:
  return write_json(Path(out) / ABLATION_JSON, info)


def read_ablation_json(out) -> dict:
  return read_json(Path(out) / ABLATION_JSON)
