"""Hugging Face BERT checkpoints <-> heads_jax parameters.

Import: a directory with ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``
(the latter needs torch), written by ``BertModel``, ``BertForPreTraining`` or
``BertForSequenceClassification``; keys with or without the ``bert.`` prefix; old TF-converted
``LayerNorm.gamma/beta`` names are accepted. Export writes a directory that
``transformers.BertModel.from_pretrained`` (and, for the heads, ``BertForPreTraining`` /
``BertForSequenceClassification``) loads.

Parameters are matched by name; every heads_jax parameter is documented by ``hf_key``.
PyTorch ``Linear.weight`` is ``[out, in]``; Flax ``kernel`` is ``[in, out]``: transposed.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from heads_jax.errors import UserError
from heads_jax.model.bert import BertModel
from heads_jax.model.config import BertConfig
from heads_jax.model.heads import BertForPreTraining, BertForSequenceClassification

ARCHITECTURES = {
    "BertModel": BertModel,
    "BertForPreTraining": BertForPreTraining,
    "BertForSequenceClassification": BertForSequenceClassification,
}

# heads_jax encoder path (after "bert/" is stripped) -> Hugging Face name (after "bert.").
_ENCODER_RULES = [
    (r"embeddings/word/embedding", "embeddings.word_embeddings.weight"),
    (r"embeddings/position/embedding", "embeddings.position_embeddings.weight"),
    (r"embeddings/token_type/embedding", "embeddings.token_type_embeddings.weight"),
    (r"embeddings/norm/(scale|bias)", r"embeddings.LayerNorm.\1"),
    (r"layers/(\d+)/attention/(query|key|value)/(kernel|bias)", r"encoder.layer.\1.attention.self.\2.\3"),
    (r"layers/(\d+)/attention/output/(kernel|bias)", r"encoder.layer.\1.attention.output.dense.\2"),
    (r"layers/(\d+)/attention/norm/(scale|bias)", r"encoder.layer.\1.attention.output.LayerNorm.\2"),
    (r"layers/(\d+)/intermediate/(kernel|bias)", r"encoder.layer.\1.intermediate.dense.\2"),
    (r"layers/(\d+)/output/(kernel|bias)", r"encoder.layer.\1.output.dense.\2"),
    (r"layers/(\d+)/norm/(scale|bias)", r"encoder.layer.\1.output.LayerNorm.\2"),
    (r"pooler/(kernel|bias)", r"pooler.dense.\1"),
]
_HEAD_RULES = [
    (r"mlm/transform/(kernel|bias)", r"cls.predictions.transform.dense.\1"),
    (r"mlm/norm/(scale|bias)", r"cls.predictions.transform.LayerNorm.\1"),
    (r"mlm/bias", "cls.predictions.bias"),
    (r"nsp/(kernel|bias)", r"cls.seq_relationship.\1"),
    (r"classifier/(kernel|bias)", r"classifier.\1"),
]


def hf_key(path: str) -> tuple[str, bool]:
  """Maps a heads_jax parameter path (``a/b/c``) to ``(Hugging Face key, transpose)``.

  Encoder keys come back with the ``bert.`` prefix only if the path starts with ``bert/``.
  """
  prefix = ""
  if path.startswith("bert/"):
    path, prefix = path[len("bert/"):], "bert."
  for rules, pre in ((_ENCODER_RULES, prefix), (_HEAD_RULES, "")):
    for pattern, repl in rules:
      if re.fullmatch(pattern, path):
        name = re.sub(pattern, repl, path)
        transpose = name.endswith(".kernel")
        name = name.replace(".kernel", ".weight").replace(".scale", ".weight")
        if name.endswith("_embeddings.weight"):
          transpose = False
        return pre + name, transpose
  raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r}")


def flat_params(model: nnx.Module) -> dict[str, np.ndarray]:
  """``{'bert/layers/0/attention/query/kernel': array, ...}`` for every parameter."""
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in flat}


def assign_params(model: nnx.Module, values: dict[str, np.ndarray], *, source: str = "checkpoint"):
  """Writes ``values`` (path -> array) into ``model``, checking every shape."""
  state = nnx.state(model, nnx.Param)
  flat = nnx.to_flat_state(state)
  for path, var in flat:
    name = "/".join(map(str, path))
    if name not in values:
      continue
    new = np.asarray(values[name])
    if new.shape != var.shape:
      raise ValueError(f"{source}: parameter {name} has shape {tuple(new.shape)} but the model config "
                       f"expects {tuple(var.shape)}; check that config.json matches the weights")
    var.value = np.asarray(new, dtype=var.dtype)
  nnx.update(model, nnx.from_flat_state(flat))


# ---------------------------------------------------------------------------------------------
# Reading Hugging Face directories.


def read_hf_state_dict(directory) -> dict[str, np.ndarray]:
  """Reads ``model.safetensors`` (or sharded safetensors, or ``pytorch_model.bin``) as numpy."""
  d = Path(directory)
  st = sorted(d.glob("model*.safetensors"))
  if st:
    out = {}
    for f in st:
      try:
        out.update(load_file(str(f)))
      except TypeError:  # bfloat16 tensors: numpy cannot hold them, go through torch
        out.update(_read_with_torch(f, safetensors=True))
      except SafetensorError as e:
        raise UserError(f"{f} is not a readable safetensors file ({e}); the file is damaged or "
                        f"truncated (an interrupted download?): download or export it again") from None
    return out
  bins = sorted(d.glob("pytorch_model*.bin"))
  if bins:
    out = {}
    for f in bins:
      out.update(_read_with_torch(f))
    return out
  raise FileNotFoundError(
      f"{d}: no model.safetensors or pytorch_model.bin; a Hugging Face BERT directory needs "
      f"config.json and its weights")


def _read_with_torch(f: Path, safetensors: bool = False) -> dict[str, np.ndarray]:
  try:
    import torch  # optional heavy dependency: only .bin and bfloat16 checkpoints need it
  except ImportError as e:
    raise ImportError(f"reading {f.name} needs PyTorch (pip install torch), or convert the "
                      f"checkpoint to safetensors") from e
  if safetensors:
    from safetensors.torch import load_file as load_torch_file  # needs torch, imported above
    sd = load_torch_file(str(f))
  else:
    sd = torch.load(str(f), map_location="cpu", weights_only=True)
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}


def normalise_hf_keys(sd: dict) -> dict[str, np.ndarray]:
  """Drops the ``bert.`` prefix of encoder keys and renames ``gamma/beta`` to ``weight/bias``."""
  out = {}
  for k, v in sd.items():
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
    k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
    if k.startswith("bert."):
      k = k[len("bert."):]
    out[k] = v
  return out


def detect_architecture(sd: dict) -> tuple[str, int | None]:
  """``(architecture, num_labels)`` from the keys of a (normalised) state dict."""
  if "classifier.weight" in sd:
    return "BertForSequenceClassification", int(sd["classifier.weight"].shape[0])
  if "cls.predictions.bias" in sd or "cls.predictions.transform.dense.weight" in sd:
    return "BertForPreTraining", None
  return "BertModel", None


def load_hf_params(model: nnx.Module, directory, *, strict_heads: bool = False) -> list[str]:
  """Copies a Hugging Face checkpoint's weights into ``model`` (any of ``ARCHITECTURES``).

  The encoder must be complete (a missing pooler is allowed: it stays freshly initialised, with
  a warning). Heads the checkpoint lacks stay freshly initialised (e.g. a classifier on a
  pre-trained encoder) unless ``strict_heads``. Returns the paths left at their initial value.
  """
  sd = normalise_hf_keys(read_hf_state_dict(directory))
  values, missing = {}, []
  for path in flat_params(model):
    key, transpose = hf_key(path)
    key = key[len("bert."):] if key.startswith("bert.") else key
    if key not in sd:
      missing.append(path)
      continue
    v = np.asarray(sd[key], np.float32)
    values[path] = v.T if transpose else v
  encoder_missing = [p for p in missing if not _is_head(p) and "pooler" not in p]
  if encoder_missing:
    raise ValueError(f"{directory}: the checkpoint lacks encoder parameters, e.g. "
                     f"{hf_key(encoder_missing[0])[0]} (for {encoder_missing[0]}); is it a BERT model?")
  if missing:
    if strict_heads:
      raise ValueError(f"{directory}: the checkpoint lacks {missing}")
    warnings.warn(f"{directory}: freshly initialised (not in the checkpoint): {', '.join(missing)}")
  assign_params(model, values, source=str(directory))
  return missing


def _is_head(path: str) -> bool:
  return path.split("/")[0] in ("mlm", "nsp", "classifier")


# ---------------------------------------------------------------------------------------------
# Writing Hugging Face directories.


def architecture_of(model: nnx.Module) -> str:
  for name, cls in ARCHITECTURES.items():
    if type(model) is cls:
      return name
  raise TypeError(f"not a heads_jax BERT model: {type(model).__name__}")


def hf_state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
  """The model's parameters under Hugging Face names (PyTorch layouts), float32."""
  sd = {}
  for path, v in flat_params(model).items():
    key, transpose = hf_key(path)
    v = np.asarray(v, np.float32)
    sd[key] = np.ascontiguousarray(v.T if transpose else v)
  if "cls.predictions.bias" in sd:
    sd["cls.predictions.decoder.bias"] = sd["cls.predictions.bias"]
  return sd


def export_hf(model: nnx.Module, tokenizer, out_dir, *, id2label: dict | None = None) -> Path:
  """Writes ``config.json`` + ``model.safetensors`` (+ tokenizer files) to ``out_dir``."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  arch = architecture_of(model)
  cfg: BertConfig = model.config
  hf = cfg.to_hf_dict()
  hf["architectures"] = [arch]
  if arch == "BertForSequenceClassification":
    n = model.num_labels
    id2label = id2label or {i: f"LABEL_{i}" for i in range(n)}
    hf["id2label"] = {str(k): v for k, v in id2label.items()}
    hf["label2id"] = {v: int(k) for k, v in id2label.items()}
  sd = hf_state_dict(model)
  sd = {k: v.copy() for k, v in sd.items()}  # safetensors refuses shared memory
  save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(hf, indent=2))
  if tokenizer is not None:
    tokenizer.save_pretrained(str(out))
  return out
