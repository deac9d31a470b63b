"""The heads_jax model directory: a trained model as plain files.

Layout::

    DIR/heads_jax.json      {"format": "heads_jax", "architecture": ..., "num_labels": ...,
                             "config": {BertConfig fields}, "id2label": {...} (classifiers)}
    DIR/params.safetensors  every parameter under its NNX path ("bert/layers/0/attention/query/kernel")
    DIR/vocab.txt, tokenizer files (tokenizer.save_pretrained)

Training runs keep their full train state in Orbax checkpoints (``heads_jax.training``); this
format is what they export and what ``load_model`` / ``heads-jax analyze`` read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from heads_jax.errors import UserError
from heads_jax.model.config import BertConfig, config_from_dict
from heads_jax.model.convert import architecture_of, assign_params, check_finite, flat_params, model_class

MANIFEST = "heads_jax.json"
PARAMS = "params.safetensors"


def is_heads_jax_dir(path) -> bool:
  return (Path(path) / MANIFEST).is_file()


def build_model(architecture: str, cfg: BertConfig, num_labels: int | None = None, seed: int = 0):
  """A freshly initialised model of ``architecture`` (``"BertModel"``, ``"BertForPreTraining"``,
  ``"BertForSequenceClassification"``, ``"BertForQuestionAnswering"``: family-neutral names)
  in ``cfg``'s family (``convert.model_class``)."""
  cls = model_class(architecture, cfg)
  rngs = nnx.Rngs(seed)
  if architecture == "BertForSequenceClassification":
    return cls(cfg, num_labels or 2, rngs=rngs)
  return cls(cfg, rngs=rngs)


def save_model(model: nnx.Module, out_dir, tokenizer=None, *, id2label: dict | None = None) -> Path:
  """Writes ``model`` (and ``tokenizer``) as a heads_jax model directory."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  arch = architecture_of(model)
  manifest = {"format": "heads_jax", "architecture": arch, "config": model.config.to_dict(),
              "num_labels": getattr(model, "num_labels", None)}
  if id2label:
    manifest["id2label"] = {str(k): v for k, v in id2label.items()}
  params = {k: np.ascontiguousarray(v) for k, v in flat_params(model).items()}
  save_file(params, str(out / PARAMS))
  (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
  if tokenizer is not None:
    tokenizer.save_pretrained(str(out))
  return out


def training_run_message(path) -> str | None:
  """When ``path`` is a training run's work directory (not a model): the line saying which of its
  subfolders to give instead; else None. A run directory holds ``checkpoints/`` and a
  ``config.json`` that is a training config (``num_train_steps``), not a model's."""
  p = Path(path)
  cfg = p / "config.json"
  is_run = (p / "checkpoints").is_dir()
  if not is_run and cfg.is_file():
    try:
      is_run = "num_train_steps" in json.loads(cfg.read_text())
    except (ValueError, OSError):
      is_run = False
  if not is_run:
    return None
  models = sorted(c.name for c in p.iterdir()
                  if c.is_dir() and ((c / MANIFEST).is_file() or (c / "config.json").is_file()))
  if models:
    give = " or ".join(str(p / m) for m in models)
    return (f"{p} is a training run's work directory, not a model: give its exported model, "
            f"{give}")
  return (f"{p} is a training run's work directory, not a model, and it has no exported model "
          f"yet (the run has not finished): finish the run, or to start a training run from its "
          f"parameters give --config.init_checkpoint={p / 'checkpoints'}")


def read_manifest(path) -> dict:
  """The manifest of a heads_jax model directory; not JSON, another format or a missing key
  is a ValueError naming the file."""
  file = Path(path) / MANIFEST
  try:
    m = json.loads(file.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{file} is not valid JSON ({e}); copy or export the model again") from None
  if not isinstance(m, dict) or m.get("format") != "heads_jax":
    raise ValueError(f"{path}/{MANIFEST} is not a heads_jax manifest")
  missing = [k for k in ("config", "architecture") if k not in m]
  if missing:
    raise ValueError(f"{file} lacks the key(s) {', '.join(missing)}; copy or export the model "
                     "again")
  return m


def load_model_dir(path, architecture: str | None = None, dtype: str | None = None):
  """Reads a heads_jax model directory. ``architecture`` may ask for the encoder only
  (``"BertModel"``) or another head, whose missing parameters stay freshly initialised."""
  path = Path(path)
  m = read_manifest(path)
  try:
    cfg = config_from_dict(m["config"])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path / MANIFEST}: its config is incomplete or wrong ({e}); copy or "
                     "export the model again") from None
  if dtype:
    cfg = cfg.replace(dtype=dtype)
  try:
    params = load_file(str(path / PARAMS))
  except SafetensorError as e:
    raise UserError(f"{path / PARAMS} is not a readable safetensors file ({e}); the file is "
                    f"damaged or truncated: copy or export the model again") from None
  check_finite(params, path / PARAMS)
  saved = m["architecture"]
  arch = architecture or saved
  model = build_model(arch, cfg, m.get("num_labels"))
  # Re-root paths when moving between the encoder and a model with heads.
  if saved != "BertModel" and arch == "BertModel":
    params = {k[len("bert/"):]: v for k, v in params.items() if k.startswith("bert/")}
  elif saved == "BertModel" and arch != "BertModel":
    params = {"bert/" + k: v for k, v in params.items()}
  expected = flat_params(model)
  # Heads may be absent (fresh), and so may the pooler: a classifier whose head has its own dense
  # layer (RoBERTa, ELECTRA, DistilBERT) has none, and its encoder gets a fresh one.
  optional = ("mlm", "nsp", "classifier", "pre_classifier", "qa_outputs", "pooler", "bert/pooler")
  missing = [k for k in expected if k not in params and not k.startswith(optional)]
  if missing:
    raise ValueError(f"{path}: {PARAMS} lacks {missing[0]} (and {len(missing) - 1} more)")
  assign_params(model, params, source=str(path / PARAMS))
  return model
