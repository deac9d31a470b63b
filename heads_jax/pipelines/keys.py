"""The one key rule of the pipelines' units (`unit_key`).

A unit's key is

    its settings  - the cosmetic fields (`COSMETIC`: logging, checkpoint cadence, presets' names)
                  - the paths (outputs, and inputs whose content the key holds instead)
                  + the identity of every input: the content of a file or folder
                    (`runfiles.fingerprint`, `runfiles.model_identity`, `runfiles.data_identity`),
                    or the finish time of the unit that wrote it (from its stage's typed result in
                    `engine.Context.results`),

so a unit reruns when a setting that changes its result changes, or when what it reads changes
behind the same path (a replaced model, an edited TSV, another SQuAD file, a moved hub ref), and
only then: a moved directory or a renamed output is the same work. The stage kinds that use it
are `heads_jax.pipelines.stages`.
"""

from __future__ import annotations

import re
from pathlib import Path

from heads_jax import runfiles

# Settings that do not change a unit's result (at any depth of its settings).
COSMETIC = ("log_every", "tensorboard", "stop_at_step", "checkpoint", "export", "preset", "title",
            "keep_checkpoints")
# The path fields of an analysis's settings (`AnalysisConfig`): the key holds their content.
ANALYSIS_PATHS = ("model", "data", "out")
# The path fields of a training config (configs/finetune.py, configs/pretrain.py).
TRAINING_PATHS = ("init_checkpoint", "tokenizer", "data.glue_dir", "data.tfds_data_dir",
                  "data.sources", "data.eval_sources", "squad.train_file", "squad.eval_file")


def settings_key(settings: dict, paths=()) -> dict:
  """``settings`` without the `COSMETIC` fields (at any depth) and the dotted ``paths``."""
  drop = {tuple(p.split(".")) for p in paths}

  def walk(d, prefix):
    out = {}
    for k, v in d.items():
      here = prefix + (k,)
      if k in COSMETIC or here in drop:
        continue
      out[k] = walk(v, here) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v
    return out
  return walk(dict(settings), ())


def unit_key(settings: dict, *, paths=(), inputs) -> dict:
  """The key of a unit (module docstring): its settings minus cosmetic fields and ``paths``,
  plus ``inputs`` (content identities or upstream finish times)."""
  return {"settings": settings_key(settings, paths), "inputs": inputs}


def _get(d: dict, dotted: str):
  for k in dotted.split("."):
    if not isinstance(d, dict) or k not in d:
      return None
    d = d[k]
  return d


def training_inputs(settings: dict, *, cache=None, init: bool = True) -> dict:
  """The identity of what a training config (configs/finetune.py or configs/pretrain.py, as a
  dict) reads: the initial model (`runfiles.model_identity`), a tokenizer path, the GLUE TSV
  files of its task's splits, SQuAD files, pre-training text sources (each ``,``/``;`` part that
  is a path: its content; other parts, TFDS names, as given). ``init=False``: not the initial
  model (a pipeline keys on the finish time of the unit that wrote it instead)."""
  out = {}
  if init and _get(settings, "init_checkpoint"):
    out["init_checkpoint"] = runfiles.model_identity(settings["init_checkpoint"], cache=cache)
  data = settings.get("data") or {}
  if "task" in settings and data.get("source") == "tsv" and data.get("glue_dir"):
    from heads_jax.data import glue
    files = {}
    for split in dict.fromkeys(s for s in (data.get("train_split"), data.get("eval_split"),
                                           data.get("fallback_train_split")) if s):
      try:
        files[split] = runfiles.fingerprint(glue.tsv_path(data["glue_dir"], settings["task"], split),
                                            cache=cache)
      except (FileNotFoundError, KeyError, ValueError):
        files[split] = None
    out["glue"] = files
  for field in ("tokenizer", "squad.train_file", "squad.eval_file", "data.sources",
                "data.eval_sources"):
    value = _get(settings, field)
    if value:
      out[field] = [runfiles.fingerprint(part, cache=cache) if Path(part).expanduser().exists()
                    else part for part in re.split(r"[;,]", str(value)) if part.strip()]
  return out
