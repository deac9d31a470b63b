"""Hugging Face checkpoints <-> heads_jax parameters, for every family of
``heads_jax.model.config.FAMILIES`` (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT).

Import: a directory with ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``
(the latter needs torch), written by the family's base model (``BertModel``, ``RobertaModel``,
...), its ``...ForSequenceClassification``, or any other task model, whose encoder is read (BERT's
``BertForPreTraining`` heads are read too); keys with or without the encoder prefix (``bert.``,
``roberta.``, ``distilbert.``, ``electra.``, ``albert.``); old TF-converted ``LayerNorm.gamma/beta``
names are accepted. Export writes a directory that the family's transformers class loads
(``XModel``, ``XForSequenceClassification``, ``XForQuestionAnswering``; ``BertForPreTraining``
for BERT): every family
converts both ways.

Parameters are matched by name; every heads_jax parameter is documented by ``hf_key``.
PyTorch ``Linear.weight`` is ``[out, in]``; Flax ``kernel`` is ``[in, out]``: transposed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from heads_jax.errors import UserError
from heads_jax.model.bert import BertModel
from heads_jax.model.config import FAMILIES, BertConfig, family_module
from heads_jax.model.heads import (BertForPreTraining, BertForQuestionAnswering,
                                   BertForSequenceClassification)

ARCHITECTURES = {
    "BertModel": BertModel,
    "BertForPreTraining": BertForPreTraining,
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForQuestionAnswering": BertForQuestionAnswering,
}

# heads_jax parameter path -> Hugging Face name, by weight scheme (``Family.weights``).
# Layer parts: heads_jax sub-path of ``layers/<u>/`` -> the family's name under its layer prefix.
_LAYER_PARTS = {
    "bert": {"attention/query": "attention.self.query", "attention/key": "attention.self.key",
             "attention/value": "attention.self.value", "attention/output": "attention.output.dense",
             "attention/norm": "attention.output.LayerNorm", "intermediate": "intermediate.dense",
             "output": "output.dense", "norm": "output.LayerNorm"},
    "distilbert": {"attention/query": "attention.q_lin", "attention/key": "attention.k_lin",
                   "attention/value": "attention.v_lin", "attention/output": "attention.out_lin",
                   "attention/norm": "sa_layer_norm", "intermediate": "ffn.lin1",
                   "output": "ffn.lin2", "norm": "output_layer_norm"},
    "albert": {"attention/query": "attention.query", "attention/key": "attention.key",
               "attention/value": "attention.value", "attention/output": "attention.dense",
               "attention/norm": "attention.LayerNorm", "intermediate": "ffn",
               "output": "ffn_output", "norm": "full_layer_layer_norm"},
}
_EMBEDDING_PARTS = {"embeddings/word": "embeddings.word_embeddings",
                    "embeddings/position": "embeddings.position_embeddings",
                    "embeddings/token_type": "embeddings.token_type_embeddings",
                    "embeddings/norm": "embeddings.LayerNorm"}
_PROJECTION = {"electra": "embeddings_project", "albert": "encoder.embedding_hidden_mapping_in"}
_BERT_HEADS = {"mlm/transform": "cls.predictions.transform.dense",
               "mlm/norm": "cls.predictions.transform.LayerNorm", "mlm": "cls.predictions",
               "nsp": "cls.seq_relationship"}
# Sequence classifier by Family.classifier: heads_jax module -> HF module.
_CLASSIFIER = {"pooler": {"classifier": "classifier"},
               "tanh": {"pre_classifier": "classifier.dense", "classifier": "classifier.out_proj"},
               "gelu": {"pre_classifier": "classifier.dense", "classifier": "classifier.out_proj"},
               "relu": {"pre_classifier": "pre_classifier", "classifier": "classifier"}}
_LEAF = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}
_DEFAULT = BertConfig()


def _own_module(cfg):
  """The family module of a family with an encoder of its own (``config`` registry), or None."""
  return None if cfg.family in FAMILIES else family_module(cfg.family)


def architectures(cfg) -> dict:
  """heads_jax architecture name -> class, for ``cfg``'s family."""
  own = _own_module(cfg)
  return ARCHITECTURES if own is None else own.ARCHITECTURES


def model_class(architecture: str, cfg) -> type:
  """The class of heads_jax ``architecture`` (``"BertModel"``, ...) in ``cfg``'s family."""
  table = architectures(cfg)
  if architecture not in table:
    raise ValueError(f"unknown architecture {architecture!r} for {cfg.family}; one of "
                     f"{sorted(table)}")
  return table[architecture]


def _layer_prefix(cfg: BertConfig, u: int) -> str:
  scheme = cfg.info.weights
  if scheme == "distilbert":
    return f"transformer.layer.{u}."
  if scheme == "albert":
    return (f"encoder.albert_layer_groups.{u // cfg.inner_group_num}."
            f"albert_layers.{u % cfg.inner_group_num}.")
  return f"encoder.layer.{u}."


def _encoder_module(cfg: BertConfig, module: str) -> str | None:
  """HF name (no prefix, no leaf) of an encoder module path, or None."""
  if module in _EMBEDDING_PARTS:
    return _EMBEDDING_PARTS[module]
  if module == "embeddings/projection":
    return _PROJECTION.get(cfg.family)
  if module == "pooler":
    return "pooler" if cfg.family == "albert" else "pooler.dense"
  m = re.fullmatch(r"layers/(\d+)/(.+)", module)
  if m and m.group(2) in _LAYER_PARTS[cfg.info.weights]:
    return _layer_prefix(cfg, int(m.group(1))) + _LAYER_PARTS[cfg.info.weights][m.group(2)]
  return None


def hf_key(path: str, cfg: BertConfig | None = None) -> tuple[str, bool]:
  """Maps a heads_jax parameter path (``a/b/c``) of a model with config ``cfg`` (default: BERT)
  to ``(Hugging Face key, transpose)``.

  Encoder keys come back with the family's prefix (``bert.``, ``roberta.``, ...) only if the path
  starts with ``bert/`` (the encoder inside a task model).
  """
  cfg = cfg or _DEFAULT
  own = _own_module(cfg)
  if own is not None:
    return own.hf_key(path, cfg)
  prefix = ""
  if path.startswith("bert/"):
    path, prefix = path[len("bert/"):], cfg.info.hf_prefix + "."
  module, _, leaf = path.rpartition("/")
  if leaf not in _LEAF:
    raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r}")
  name = _encoder_module(cfg, module)
  if name is None:
    prefix = ""
    if path == "mlm/bias":
      return "cls.predictions.bias", False
    heads = dict(_CLASSIFIER[cfg.info.classifier], qa_outputs="qa_outputs")  # every family's span head
    if cfg.family == "bert":
      heads.update(_BERT_HEADS)
    name = heads.get(module)
  if name is None:
    raise KeyError(f"no Hugging Face name for heads_jax parameter {path!r} ({cfg.family})")
  return prefix + name + "." + _LEAF[leaf], leaf == "kernel"


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


def check_finite(tensors: dict, source) -> None:
  """Raises a ``UserError`` naming the first floating-point tensor of ``tensors`` (name -> array)
  that holds NaN or infinite values, and ``source`` (the file it was read from): such weights
  (a diverged run's, a damaged file's) would only give NaN scores or losses after the work."""
  for name, v in tensors.items():
    a = np.asarray(v)
    if a.dtype.kind != "f" and "bfloat16" not in str(a.dtype):
      continue
    a = a if a.dtype.kind == "f" else a.astype(np.float32)
    finite = np.isfinite(a)
    if finite.all():
      continue
    nan = int(np.isnan(a).sum())
    inf = int(a.size - finite.sum()) - nan
    raise UserError(f"{source}: tensor {name} holds {nan} NaN and {inf} infinite value(s) of "
                    f"{a.size}: these weights are damaged (a diverged training run or a corrupt "
                    f"file); use an earlier checkpoint, or download or export the model again")


# ---------------------------------------------------------------------------------------------
# Reading Hugging Face directories.


def read_hf_state_dict(directory) -> dict[str, np.ndarray]:
  """Reads ``model.safetensors`` (or sharded safetensors, or ``pytorch_model.bin``) as numpy;
  a tensor with NaN or infinite values is refused (``check_finite``, naming it and its file)."""
  d = Path(directory)
  st = sorted(d.glob("model*.safetensors"))
  if st:
    out = {}
    for f in st:
      try:
        part = load_file(str(f))
      except TypeError:  # bfloat16 tensors: numpy cannot hold them, go through torch
        part = _read_with_torch(f, safetensors=True)
      except SafetensorError as e:
        raise UserError(f"{f} is not a readable safetensors file ({e}); the file is damaged or "
                        f"truncated (an interrupted download?): download or export it again") from None
      check_finite(part, f)
      out.update(part)
    return out
  bins = sorted(d.glob("pytorch_model*.bin"))
  if bins:
    out = {}
    for f in bins:
      part = _read_with_torch(f)
      check_finite(part, f)
      out.update(part)
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


def normalise_hf_keys(sd: dict, cfg: BertConfig | None = None) -> dict[str, np.ndarray]:
  """Drops the encoder prefix of a task model's keys (the family's ``bert.``, ``roberta.``, ...;
  any known one without ``cfg``) and renames ``gamma/beta`` to ``weight/bias``."""
  prefixes = ([cfg.info.hf_prefix + "."] if cfg is not None
              else sorted({f.hf_prefix + "." for f in FAMILIES.values()}))
  out = {}
  for k, v in sd.items():
    k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
    k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
    for prefix in prefixes:
      if k.startswith(prefix):
        k = k[len(prefix):]
        break
    out[k] = v
  return out


def detect_architecture(sd: dict) -> tuple[str, int | None]:
  """``(architecture, num_labels)`` from the keys of a (normalised) state dict. Heads other than
  a sequence classifier and BERT's pre-training heads (e.g. RoBERTa's ``lm_head``) are ignored:
  such a checkpoint loads as its encoder."""
  for key in ("classifier.out_proj.weight", "classifier.weight"):
    if key in sd:
      return "BertForSequenceClassification", int(sd[key].shape[0])
  if "qa_outputs.weight" in sd:
    return "BertForQuestionAnswering", None
  if "cls.predictions.bias" in sd or "cls.predictions.transform.dense.weight" in sd:
    return "BertForPreTraining", None
  return "BertModel", None


def load_hf_params(model: nnx.Module, directory, *, strict_heads: bool = False) -> list[str]:
  """Copies a Hugging Face checkpoint's weights into ``model`` (any of ``ARCHITECTURES``, of the
  family its config names).

  The encoder must be complete (a missing pooler is allowed: it stays freshly initialised), and
  every encoder tensor of the checkpoint must be used (``check_unused``: a ``config.json`` with
  fewer layers than the weights is refused, not read as a truncated model). Heads the checkpoint
  lacks stay freshly initialised (e.g. a classifier on a pre-trained encoder: expected, so no
  warning; the caller may say so) unless ``strict_heads``. Returns the paths left at their
  initial value.
  """
  cfg: BertConfig = model.config
  sd = normalise_hf_keys(read_hf_state_dict(directory), cfg)
  values, missing, used = {}, [], set()
  for path in flat_params(model):
    key, transpose = _unprefixed(hf_key(path, cfg), cfg)
    if key not in sd:
      missing.append(path)
      continue
    used.add(key)
    v = np.asarray(sd[key], np.float32)
    values[path] = v.T if transpose else v
  check_unused(sd, used, cfg, directory)
  encoder_missing = [p for p in missing if not _is_head(p) and "pooler" not in p]
  if encoder_missing:
    raise ValueError(f"{directory}: the checkpoint lacks encoder parameters, e.g. "
                     f"{hf_key(encoder_missing[0], cfg)[0]} (for {encoder_missing[0]}); is it a "
                     f"{cfg.family} model?")
  if missing and strict_heads:
    raise ValueError(f"{directory}: the checkpoint lacks {missing}")
  assign_params(model, values, source=str(directory))
  return missing


# Encoder tensors (keys without the task prefix) by their first name part; buffers that
# transformers saves but no parameter reads (position ids, rotary frequencies) are not tensors
# of the model. A pooler is optional (a classifier with its own dense layer has none).
_ENCODER_ROOTS = ("embeddings.", "encoder.", "transformer.", "layers.", "final_norm.",
                  "embeddings_project.")
_BUFFERS = ("position_ids", "inv_freq", "token_type_ids")


def check_unused(sd: dict, used: set, cfg, directory) -> None:
  """Refuses (UserError, one line) a checkpoint with encoder tensors the config leaves unused:
  layers beyond ``num_hidden_layers`` (a config.json that does not match its weights), or any
  other encoder tensor the model has no parameter for."""
  unused = sorted(k for k in sd if k not in used and k.startswith(_ENCODER_ROOTS)
                  and not k.endswith(_BUFFERS))
  if not unused:
    return
  layers = sorted({int(m.group(1)) for k in unused
                   if (m := re.search(r"(?:^|\.)(?:layer|layers|albert_layers)\.(\d+)\.", k))})
  e_g = ", ".join(unused[:3])
  if layers:
    n = getattr(cfg, "num_hidden_layers", cfg.num_layers)
    span = f"{layers[0]}..{layers[-1]}" if len(layers) > 1 else f"{layers[0]}"
    raise UserError(f"{directory}: config.json says num_hidden_layers={n} but the weights hold "
                    f"layer {span} too ({len(unused)} tensors, e.g. {e_g}): fix config.json or "
                    "the weights")
  raise UserError(f"{directory}: the weights hold {len(unused)} encoder tensor(s) that a "
                  f"{cfg.family} model of this config.json has no place for (e.g. {e_g}): fix "
                  "config.json or the weights")


def _unprefixed(key_transpose, cfg: BertConfig):
  key, transpose = key_transpose
  prefix = cfg.info.hf_prefix + "."
  return (key[len(prefix):] if key.startswith(prefix) else key), transpose


def _is_head(path: str) -> bool:
  return path.split("/")[0] in ("mlm", "nsp", "classifier", "pre_classifier", "qa_outputs")


# ---------------------------------------------------------------------------------------------
# Writing Hugging Face directories.


def architecture_of(model: nnx.Module) -> str:
  cfg = getattr(model, "config", None)
  own = _own_module(cfg) if cfg is not None and hasattr(cfg, "info") else None
  for name, cls in (ARCHITECTURES if own is None else own.ARCHITECTURES).items():
    if type(model) is cls:
      return name
  raise TypeError(f"not a heads_jax model: {type(model).__name__}")


def hf_architecture(architecture: str, cfg: BertConfig) -> str:
  """The transformers class of a heads_jax architecture in ``cfg``'s family
  (``BertForSequenceClassification`` -> ``RobertaForSequenceClassification``, ...)."""
  return cfg.info.hf_class + architecture[len("Bert"):]


def hf_state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
  """The model's parameters under Hugging Face names (PyTorch layouts), float32."""
  cfg: BertConfig = model.config
  sd = {}
  for path, v in flat_params(model).items():
    key, transpose = hf_key(path, cfg)
    v = np.asarray(v, np.float32)
    sd[key] = np.ascontiguousarray(v.T if transpose else v)
  if "cls.predictions.bias" in sd:
    sd["cls.predictions.decoder.bias"] = sd["cls.predictions.bias"]
  return sd


def export_hf(model: nnx.Module, tokenizer, out_dir, *, id2label: dict | None = None) -> Path:
  """Writes ``config.json`` + ``model.safetensors`` (+ tokenizer files) to ``out_dir``: a
  directory that the family's transformers class (``hf_architecture``) loads."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  arch = architecture_of(model)
  cfg: BertConfig = model.config
  hf = cfg.to_hf_dict()
  hf["architectures"] = [hf_architecture(arch, cfg)]
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
