"""``load_model``: a model and its tokenizer from a Hugging Face directory (any family of
``heads_jax.model.config.FAMILIES``), a hub id in the local Hugging Face cache, or a heads_jax
directory."""

from __future__ import annotations

from pathlib import Path

from heads_jax import hub
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import (build_model, is_heads_jax_dir, load_model_dir, read_manifest,
                                        save_model, training_run_message)
from heads_jax.model.config import config_from_dict, config_from_hf_file
from heads_jax.model.convert import architectures, detect_architecture, export_hf, load_hf_params, normalise_hf_keys, read_hf_state_dict

HEADS = {None: None, "encoder": "BertModel", "pretraining": "BertForPreTraining",
         "classification": "BertForSequenceClassification",
         "question-answering": "BertForQuestionAnswering", "auto": "auto"}


def load_model(path, *, head: str | None = None, num_labels: int | None = None,
               dtype: str | None = None, with_tokenizer: bool = True):
  """Loads ``(model, tokenizer)``.

  Args:
    path: a Hugging Face directory of BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA or ALBERT
      (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``, tokenizer files), a
      hub id such as ``roberta-base`` (``heads_jax.hub``: the local Hugging Face cache, which
      honours ``HF_HOME`` and ``HF_HUB_OFFLINE``), or a heads_jax model directory
      (``heads_jax.json``). An existing local path always wins over a hub id.
    head: ``None``/``"encoder"`` gives the ``BertModel`` encoder (what the analysis needs);
      ``"pretraining"``, ``"classification"`` (with ``num_labels``), ``"question-answering"``
      (a span head) or ``"auto"`` (whatever the
      checkpoint holds) give a model with heads; heads absent from the checkpoint are freshly
      initialised.
    dtype: compute dtype override (``"float32"``/``"bfloat16"``).

  Returns:
    ``(model, tokenizer)``; ``model(input_ids, attention_mask=..., token_type_ids=...,
    return_attentions=True)["attentions"]`` is float32 ``[b, l, h, q, k]``; the tokenizer is the
    directory's fast tokenizer (``heads_jax.data.tokenizer``; ``None`` if
    ``with_tokenizer=False``).
  """
  p = hub.model_path(path)
  if not p.is_dir():
    raise ValueError(f"model path {p} is a file; pass the directory that holds config.json "
                     f"(Hugging Face) or heads_jax.json (heads_jax)")
  run = training_run_message(p)
  if run is not None:
    raise UserError(run)
  if head not in HEADS:
    raise ValueError(f"head must be one of {list(HEADS)}, got {head!r}")
  arch = HEADS[head]
  if is_heads_jax_dir(p):
    if arch == "auto":
      arch = read_manifest(p)["architecture"]
    model = load_model_dir(p, arch or "BertModel", dtype=dtype)
  elif (p / "config.json").is_file():
    cfg = config_from_hf_file(p / "config.json")
    if dtype:
      cfg = cfg.replace(dtype=dtype)
    labels = num_labels
    if arch == "auto":
      arch, labels = detect_architecture(normalise_hf_keys(read_hf_state_dict(p), cfg))
      labels = num_labels or labels
      if arch not in architectures(cfg):  # a head the family has no heads_jax twin of: the encoder
        arch = "BertModel"
    model = build_model(arch or "BertModel", cfg, labels)
    load_hf_params(model, p)
  else:
    raise FileNotFoundError(f"{p} holds neither config.json (Hugging Face model) nor heads_jax.json "
                            f"(heads_jax model directory)")
  tokenizer = load_tokenizer(p) if with_tokenizer else None
  return model, tokenizer


def model_config(path):
  """The config of a model directory or cached hub id, without reading its weights."""
  p = hub.model_path(path)
  if is_heads_jax_dir(p):
    return config_from_dict(read_manifest(p)["config"])
  return config_from_hf_file(p / "config.json")


def layer_windows(path) -> tuple | None:
  """Per layer, the half window ``w`` of a windowed layer (query ``t`` sees keys
  ``|s - t| <= w``: ModernBERT's local layers) or None (full attention); None for a model
  without windowed layers, or when ``path`` is not a readable model. For the host statistics
  (``heads_jax.hoststats.calibration``: uniform attention over the keys a head sees)."""
  try:
    windows = getattr(model_config(path), "windows", None)
  except (OSError, ValueError, KeyError, UserError):
    return None
  return tuple(windows) if windows is not None and any(w is not None for w in windows) else None


def convert_dir(src, dst, *, overwrite: bool = False):
  """Converts the model directory ``src`` into ``dst``: a heads_jax directory (one with
  ``heads_jax.json``) is exported to Hugging Face format, a Hugging Face directory imported into
  heads_jax format, heads included. Returns ``(kind written, model)``. Refuses a non-empty
  ``dst`` unless ``overwrite``, and with it a directory that is not a model's (a run, an
  analysis). The model is written into a new folder beside ``dst`` that then replaces it as a
  whole: no file of an earlier model is left beside the new one, and a conversion that fails (a
  full disk) leaves ``dst`` as it was."""
  import os
  import shutil
  from safetensors import SafetensorError
  from heads_jax import runfiles
  src, dst = hub.model_path(src), Path(dst)
  if dst.exists() and not dst.is_dir():  # even an empty file: a model is a directory
    raise UserError(f"{dst} is a file; a model is written as a directory: give a new directory "
                    "path")
  if dst.exists() and any(dst.iterdir()):
    if not overwrite:
      raise UserError(f"{dst} is not empty; choose a new directory or pass --overwrite (it "
                      "replaces that directory as a whole)")
    runfiles.check_dir(dst, "model", flag="dst")   # a run's folder is never replaced
    if (runfiles.read_job(dst) or {}).get("kind", runfiles.guess_kind(dst)) != "model":
      raise UserError(f"{dst} holds files that are not a model's ({next(dst.iterdir()).name}, "
                      "...); --overwrite replaces a model directory as a whole: choose another "
                      "directory")
    if Path(src).resolve() == dst.resolve():
      raise UserError(f"{dst} is the source model; write the conversion to another directory")
  model, tokenizer = load_model(src, head="auto")
  tmp = dst.with_name(f".{dst.name}.converting-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    if is_heads_jax_dir(src):
      kind = "Hugging Face"
      export_hf(model, tokenizer, tmp)
    else:
      kind = "heads_jax"
      save_model(model, tmp, tokenizer)
  except (OSError, SafetensorError) as e:
    shutil.rmtree(tmp, ignore_errors=True)
    full = getattr(e, "errno", None) == 28 or "StorageFull" in str(e) or "No space" in str(e)
    why = "the disk is full" if full else f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    raise UserError(f"writing the converted model to {dst} failed ({why}); {dst} was left as it "
                    "was: free some space (or choose another disk) and run the command again") from None
  if dst.exists():
    old = dst.with_name(f".{dst.name}.replaced-{os.getpid()}")
    dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)
  else:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dst)
  return kind, model
