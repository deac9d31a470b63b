"""Encoder configuration: one post-LN Transformer encoder, six model families, size variants.

Every supported family is the same encoder (``heads_jax.model.bert``) with a few switches; the
families differ only in configuration and in the names of their weights:

===============  =============  =========  ==============  ==========  ===========  ===========
family           token types    positions  embedding size  pooler      layers       classifier
===============  =============  =========  ==============  ==========  ===========  ===========
``bert``         2 rows         0..        hidden          yes         own          pooler
``roberta``      1 row (0)      pad + 1..  hidden          yes         own          dense, tanh
``xlm-roberta``  1 row (0)      pad + 1..  hidden          yes         own          dense, tanh
``distilbert``   none           0..        hidden          no          own          dense, relu
``electra``      2 rows         0..        E (projected)   no          own          dense, gelu
``albert``       2 rows         0..        E (projected)   yes         shared       pooler
===============  =============  =========  ==============  ==========  ===========  ===========

* Token types: ``type_vocab_size`` rows; with 0 rows (DistilBERT) there is no table, with 1 row
  every position gets row 0 (RoBERTa: the model ignores segment ids), with 2 or more the
  ``token_type_ids`` index it.
* Positions: position ``i`` of a sequence uses row ``position_offset + i`` (RoBERTa:
  ``pad_token_id + 1``, as fairseq), so at most ``max_position_embeddings - position_offset``
  positions fit (``max_positions``). DistilBERT's sinusoidal table (``sinusoidal_positions``) is
  an ordinary parameter initialised to the sinusoids.
* ``embedding_size`` (0 = ``hidden_size``) with ``embedding_projection``: ELECTRA's
  ``embeddings_project`` and ALBERT's ``embedding_hidden_mapping_in`` (a linear map applied
  after the embedding LayerNorm).
* ALBERT's sharing: ``num_hidden_groups`` groups of ``inner_group_num`` layers; HF's layer
  ``i`` of ``num_hidden_layers`` runs group ``int(i / (num_hidden_layers / num_hidden_groups))``.
  ``num_layers`` here always counts the attention layers *applied* (``num_hidden_layers *
  inner_group_num``), which is what attention maps, head gates and every ``[l, h]`` array index;
  ``layer_schedule`` says which distinct layer each applied layer runs.

Field names follow the paper/JAX world; ``from_hf_dict`` / ``to_hf_dict`` translate to and from a
Hugging Face ``config.json`` of any of the families.

Families with an encoder of their own, ModernBERT (``heads_jax.model.modernbert``) and DeBERTa-v3
(``heads_jax.model.deberta``), are ``OWN_FAMILIES``: each module defines its config, classes and
Hugging Face names ("The registry" below); ``config_from_hf_dict`` / ``config_from_dict`` read
the config of any family.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

from heads_jax.errors import UserError

# name: (num_layers, num_heads, hidden_size, intermediate_size)
SIZES = {
    "tiny": (2, 4, 64, 128),       # tests
    "mini": (4, 4, 256, 1024),     # Turc et al. BERT-mini
    "demo": (6, 8, 128, 512),      # the demo's model: 6 layers x 8 heads, trains in minutes on a CPU
    "small": (6, 8, 256, 1024),    # quick experiments on one GPU / a Colab TPU
    "base": (12, 12, 768, 3072),   # BERT-base (Devlin et al.), the paper's model
    "large": (24, 16, 1024, 4096),  # BERT-large
}


@dataclasses.dataclass(frozen=True)
class Family:
  """What distinguishes a model family beyond its hyper-parameters."""
  name: str
  model_type: str     # Hugging Face config.json "model_type"
  hf_class: str       # Hugging Face class prefix: f"{hf_class}Model", f"{hf_class}ForSequenceClassification"
  hf_prefix: str      # the encoder's key prefix in a task model's state dict ("bert.", "roberta.", ...)
  classifier: str     # sequence classifier: "pooler" (pooled [CLS] -> linear) or the activation of
                      # its own dense layer on [CLS] ("tanh", "gelu", "relu")
  weights: str        # weight-name scheme of the layers: "bert", "distilbert" or "albert"
  module: str = "heads_jax.model.bert"  # the module that defines the family's encoder (registry below)


FAMILIES = {f.name: f for f in (
    Family("bert", "bert", "Bert", "bert", "pooler", "bert"),
    Family("roberta", "roberta", "Roberta", "roberta", "tanh", "bert"),
    Family("xlm-roberta", "xlm-roberta", "XLMRoberta", "roberta", "tanh", "bert"),
    Family("distilbert", "distilbert", "DistilBert", "distilbert", "relu", "distilbert"),
    Family("electra", "electra", "Electra", "electra", "gelu", "bert"),
    Family("albert", "albert", "Albert", "albert", "pooler", "albert"),
)}
# Families with an encoder module of their own (not BertConfig switches): "The registry" below.
OWN_FAMILIES = {f.name: f for f in (
    Family("modernbert", "modernbert", "ModernBert", "model", "modernbert", "modernbert",
           module="heads_jax.model.modernbert"),
    Family("deberta-v2", "deberta-v2", "DebertaV2", "deberta", "deberta", "deberta",
           module="heads_jax.model.deberta"),
)}
BERT_MODULE = "heads_jax.model.bert"
ALL_FAMILIES = {**FAMILIES, **OWN_FAMILIES}


ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu")  # hidden_act
DTYPES = ("float32", "bfloat16")


class ConfigMethods:
  """What every family's config dataclass shares (``BertConfig``, DeBERTa's and ModernBERT's:
  "The registry" below): ``replace``, ``to_dict``/``from_dict`` (keys it does not know are left
  out: older files), ``head_dim`` and ``check_sizes`` for the fields every family has."""

  def check_sizes(self) -> None:
    """Refuses (ValueError) a ``hidden_size`` that ``num_heads`` does not divide, a ``dtype``
    other than ``DTYPES`` and a ``hidden_act`` other than ``ACTIVATIONS``."""
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    check_activation("hidden_act", self.hidden_act)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def replace(self, **kw):
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def check_activation(name: str, value: str, allowed=ACTIVATIONS) -> None:
  """Refuses (ValueError) the activation ``value`` of the field ``name`` unless it is in
  ``allowed``."""
  if value not in allowed:
    raise ValueError(f"{name} {value!r} is not supported; use one of {sorted(allowed)}")


def hf_encoder_fields(d: dict, *, type_vocab_size: int, layer_norm_eps: float) -> dict:
  """The fields of a BERT-style Hugging Face ``config.json`` ``d`` (BERT, RoBERTa, ELECTRA,
  ALBERT, DeBERTa) that every such config names alike, as config fields (``type_vocab_size``
  and ``layer_norm_eps``: the family's defaults when ``d`` lacks them)."""
  return dict(
      vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
      max_position_embeddings=d.get("max_position_embeddings", 512),
      type_vocab_size=d.get("type_vocab_size", type_vocab_size),
      layer_norm_eps=d.get("layer_norm_eps", layer_norm_eps),
      hidden_dropout=d.get("hidden_dropout_prob", 0.1),
      attention_dropout=d.get("attention_probs_dropout_prob", 0.1),
      initializer_range=d.get("initializer_range", 0.02),
      hidden_act=d.get("hidden_act", "gelu"), pad_token_id=d.get("pad_token_id", 0) or 0)


@dataclasses.dataclass(frozen=True)
class BertConfig(ConfigMethods):
  """Hyper-parameters of a post-LN encoder of one of ``FAMILIES`` (defaults: BERT-base uncased)."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12               # applied layers (ALBERT: num_hidden_layers x inner_group_num)
  num_heads: int = 12                # Hugging Face: num_attention_heads
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1        # Hugging Face: hidden_dropout_prob
  attention_dropout: float = 0.1     # Hugging Face: attention_probs_dropout_prob
  initializer_range: float = 0.02
  hidden_act: str = "gelu"  # "gelu" (exact erf, as BERT) or "gelu_new"/"gelu_tanh"
  dtype: str = "float32"    # compute dtype; parameters, softmax and LayerNorm stay float32
  pad_token_id: int = 0
  family: str = "bert"
  embedding_size: int = 0            # 0: hidden_size
  embedding_projection: bool = False  # a linear map embedding_size -> hidden_size after the embeddings
  position_offset: int = 0
  sinusoidal_positions: bool = False
  pooler: bool = True
  num_hidden_groups: int = 0         # ALBERT: groups of shared layers (0: every layer its own weights)
  inner_group_num: int = 1
  classifier_dropout: float | None = None  # None: hidden_dropout
  # Not Hugging Face fields (never in to_hf_dict); old heads_jax.json files get the defaults.
  attention: str = "auto"            # BertModel's default attention path (heads_jax.model.bert)
  layer_norm_dtype: str = "compute"  # "compute": LayerNorm outputs and residual stream in `dtype`
                                     # (float32 statistics); "float32": float32 outputs
  dropout_bits: int = 32             # random bits per dropout-mask element: 32 (nnx.Dropout's
                                     # own draw), 16 or 8 (heads_jax.model.fused_ops.dropout_keep)

  def __post_init__(self):
    self.check_sizes()
    if self.attention not in ATTENTION_SETTINGS:
      raise ValueError(f"attention must be one of {ATTENTION_SETTINGS}, got {self.attention!r}")
    if self.layer_norm_dtype not in LAYER_NORM_DTYPES:
      raise ValueError(f"layer_norm_dtype must be one of {LAYER_NORM_DTYPES}, got "
                       f"{self.layer_norm_dtype!r}")
    if self.dropout_bits not in (8, 16, 32):
      raise ValueError(f"dropout_bits must be 8, 16 or 32, got {self.dropout_bits!r}")
    if self.family not in FAMILIES:
      raise ValueError(f"family {self.family!r} is not supported; use one of {sorted(FAMILIES)}")
    if self.embed_dim != self.hidden_size and not self.embedding_projection:
      raise ValueError(f"embedding_size {self.embedding_size} differs from hidden_size "
                       f"{self.hidden_size}: set embedding_projection=True")
    if self.inner_group_num < 1 or self.num_layers % self.inner_group_num:
      raise ValueError(f"num_layers {self.num_layers} must be a multiple of inner_group_num "
                       f"{self.inner_group_num} (num_layers counts applied layers)")
    if not 0 <= self.num_hidden_groups <= self.num_layers // self.inner_group_num:
      raise ValueError(f"num_hidden_groups {self.num_hidden_groups} must be between 0 and "
                       f"{self.num_layers // self.inner_group_num}")
    if self.max_positions < 1:
      raise ValueError(f"position_offset {self.position_offset} leaves no position of "
                       f"{self.max_position_embeddings}")

  @property
  def info(self) -> Family:
    return FAMILIES[self.family]

  @property
  def embed_dim(self) -> int:
    """Width of the embedding tables (``embedding_size``, or ``hidden_size`` when 0)."""
    return self.embedding_size or self.hidden_size

  @property
  def max_positions(self) -> int:
    """The longest sequence the position table holds."""
    return self.max_position_embeddings - self.position_offset

  @property
  def num_hidden_layers(self) -> int:
    """Hugging Face's ``num_hidden_layers`` (ALBERT: applications of a layer group)."""
    return self.num_layers // self.inner_group_num

  @property
  def num_distinct_layers(self) -> int:
    """How many layers have their own weights."""
    if not self.num_hidden_groups:
      return self.num_layers
    return self.num_hidden_groups * self.inner_group_num

  @property
  def layer_schedule(self) -> tuple[int, ...]:
    """For each applied layer ``0..num_layers-1``, the distinct layer (weights) it runs."""
    if not self.num_hidden_groups:
      return tuple(range(self.num_layers))
    n, g, inner = self.num_hidden_layers, self.num_hidden_groups, self.inner_group_num
    return tuple(int(i / (n / g)) * inner + j for i in range(n) for j in range(inner))

  def check_max_length(self, max_length: int) -> None:
    """Refuses (UserError) sequences of ``max_length`` positions that the position embeddings
    cannot hold; call it before encoding any data."""
    if max_length > self.max_positions:
      offset = (f" ({self.max_position_embeddings} rows, the first {self.position_offset} unused)"
                if self.position_offset else " (max_position_embeddings)")
      raise UserError(f"--max-length {max_length} exceeds the model's {self.max_positions} "
                      f"positions{offset}; use --max-length {self.max_positions} or less")

  def to_hf_dict(self) -> dict:
    """The Hugging Face config dictionary (``config.json``) of this family's encoder."""
    fam = self.info
    common = {"architectures": [f"{fam.hf_class}Model"], "model_type": fam.model_type,
              "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
              "initializer_range": self.initializer_range, "pad_token_id": self.pad_token_id}
    if self.family == "distilbert":
      return {**common, "dim": self.hidden_size, "n_layers": self.num_layers, "n_heads": self.num_heads,
              "hidden_dim": self.intermediate_size, "activation": self.hidden_act,
              "dropout": self.hidden_dropout, "attention_dropout": self.attention_dropout,
              "sinusoidal_pos_embds": self.sinusoidal_positions,
              "seq_classif_dropout": _or(self.classifier_dropout, 0.2)}
    out = {**common, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
           "num_attention_heads": self.num_heads, "intermediate_size": self.intermediate_size,
           "hidden_act": self.hidden_act, "hidden_dropout_prob": self.hidden_dropout,
           "attention_probs_dropout_prob": self.attention_dropout,
           "type_vocab_size": self.type_vocab_size, "layer_norm_eps": self.layer_norm_eps,
           "position_embedding_type": "absolute"}
    if self.family in ("electra", "albert"):
      out["embedding_size"] = self.embed_dim
    if self.family == "albert":
      out.update(num_hidden_groups=self.num_hidden_groups or self.num_hidden_layers,
                 inner_group_num=self.inner_group_num,
                 classifier_dropout_prob=_or(self.classifier_dropout, 0.1))
    elif self.classifier_dropout is not None:
      out["classifier_dropout"] = self.classifier_dropout
    if self.family in ("roberta", "xlm-roberta"):
      out.update(bos_token_id=0, eos_token_id=2)
    return out

  @classmethod
  def from_hf_dict(cls, d: dict) -> "BertConfig":
    """Reads a Hugging Face ``config.json`` dictionary of any of ``FAMILIES``."""
    model_type = d.get("model_type", "bert")
    by_type = {f.model_type: f.name for f in FAMILIES.values()}
    if model_type not in by_type:
      if model_type in _MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} has its own config class: read it with "
                         "heads_jax.model.config.config_from_hf_dict")
      raise ValueError(f"model_type is {model_type!r}; heads_jax loads "
                       f"{', '.join(sorted(by_type))} models")
    family = by_type[model_type]
    pet = d.get("position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
      raise ValueError(f"position_embedding_type {pet!r} is not supported (only 'absolute')")
    pad = d.get("pad_token_id", 0) or 0
    if family == "distilbert":
      return cls(vocab_size=d["vocab_size"], hidden_size=d["dim"], num_layers=d["n_layers"],
                 num_heads=d["n_heads"], intermediate_size=d["hidden_dim"],
                 max_position_embeddings=d.get("max_position_embeddings", 512), type_vocab_size=0,
                 layer_norm_eps=1e-12,  # fixed in transformers' DistilBERT
                 hidden_dropout=d.get("dropout", 0.1),
                 attention_dropout=d.get("attention_dropout", 0.1),
                 initializer_range=d.get("initializer_range", 0.02),
                 hidden_act=d.get("activation", "gelu"), pad_token_id=pad, family=family,
                 sinusoidal_positions=bool(d.get("sinusoidal_pos_embds", False)), pooler=False,
                 classifier_dropout=d.get("seq_classif_dropout", 0.2))
    hidden = d["hidden_size"]
    kw = dict(hf_encoder_fields(d, type_vocab_size=2, layer_norm_eps=1e-12), family=family,
              classifier_dropout=d.get("classifier_dropout"))
    if family in ("roberta", "xlm-roberta"):
      kw["position_offset"] = pad + 1
    elif family == "electra":
      e = d.get("embedding_size") or hidden
      kw.update(embedding_size=e if e != hidden else 0, embedding_projection=e != hidden,
                pooler=False)
    elif family == "albert":
      inner = d.get("inner_group_num", 1)
      kw.update(embedding_size=d.get("embedding_size", 128), embedding_projection=True,
                num_layers=d["num_hidden_layers"] * inner,
                num_hidden_groups=d.get("num_hidden_groups", 1), inner_group_num=inner,
                classifier_dropout=d.get("classifier_dropout_prob", 0.1))
    return cls(**kw)

  @classmethod
  def from_hf_file(cls, path):
    """From a Hugging Face ``config.json`` of any family (``config_from_hf_file``)."""
    return config_from_hf_file(path)


# Alias: the configuration is not specific to BERT.
EncoderConfig = BertConfig
_MODEL_TYPES = {f.model_type: f for f in ALL_FAMILIES.values()}


# ---------------------------------------------------------------------------------------------
# The registry: families with an encoder module of their own.
#
# A family of ``OWN_FAMILIES`` (ModernBERT, DeBERTa-v3; ``FAMILIES`` are the ``BertConfig``
# families, ``ALL_FAMILIES`` both) is defined by the module that its ``Family.module`` names,
# imported on first use (``family_module``). It defines:
#
# * ``Config``: a frozen dataclass with the fields ``family``, ``dtype``, ``num_layers``,
#   ``num_heads``, ``hidden_size``, ``hidden_act``, ``vocab_size``, ``pad_token_id``; the class
#   methods ``from_hf_dict`` and ``from_dict``; the methods ``to_hf_dict``, ``to_dict``,
#   ``replace``, ``check_max_length``; the properties ``info`` (its ``Family``), ``head_dim``,
#   ``max_positions`` and ``layer_schedule`` (``ConfigMethods`` gives ``from_dict``,
#   ``to_dict``, ``replace``, ``head_dim`` and the checks of the shared fields).
# * ``ARCHITECTURES``: heads_jax architecture name (``"BertModel"`` for the encoder,
#   ``"BertForSequenceClassification"``, ...: the names stay family-neutral in manifests) ->
#   module class; a task model holds its encoder as ``.bert``.
# * ``hf_key(path, cfg) -> (Hugging Face key, transpose)`` for every parameter path
#   (``heads_jax.model.convert.hf_key``'s contract).
#
# Its encoder takes ``BertModel``'s call signature (``return_attentions``, ``attention_reduce``,
# ``head_gate``, ``return_hidden_states``, ...), so the analysis, ablations and fine-tuning
# use it unchanged; its layers give their value vectors as ``layer.values(x)`` for the norm pass.


def family_module(family: str):
  """The module that defines ``family``'s encoder (imported on first use)."""
  if family not in ALL_FAMILIES:
    raise ValueError(f"family {family!r} is not supported; use one of {sorted(ALL_FAMILIES)}")
  return importlib.import_module(ALL_FAMILIES[family].module)


def config_class(family: str) -> type:
  """The config dataclass of ``family``: ``BertConfig`` or the family module's ``Config``."""
  if family not in ALL_FAMILIES:
    raise ValueError(f"family {family!r} is not supported; use one of {sorted(ALL_FAMILIES)}")
  if family in FAMILIES:
    return BertConfig
  return family_module(family).Config


def config_from_hf_dict(d: dict):
  """The config of a Hugging Face ``config.json`` dictionary of any family of ``FAMILIES``."""
  model_type = d.get("model_type", "bert")
  if model_type not in _MODEL_TYPES:
    raise ValueError(f"model_type is {model_type!r}; heads_jax loads "
                     f"{', '.join(sorted(_MODEL_TYPES))} models")
  return config_class(_MODEL_TYPES[model_type].name).from_hf_dict(d)


def config_from_hf_file(path):
  """``config_from_hf_dict`` of a ``config.json``; a file that is not JSON or lacks a key is a
  ValueError naming the file."""
  try:
    d = json.loads(Path(path).read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); copy or export the model again") from None
  if not isinstance(d, dict):
    raise ValueError(f"{path} is not a model config (a JSON object); copy or export the model again")
  quoted = [k for k, v in d.items() if isinstance(v, str) and not k.startswith("_")
            and k != "transformers_version" and _is_number(v)]
  if quoted:
    k = quoted[0]
    raise ValueError(f"{path}: {k} is the string {json.dumps(d[k])}, not a number; write it "
                     f"without quotes (\"{k}\": {d[k].strip()})")
  try:
    return config_from_hf_dict(d)
  except KeyError as e:
    raise ValueError(f"{path} lacks the key {e} that a model config needs; copy or export the "
                     "model again") from None


def _is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return text.strip().lower() not in ("nan", "inf", "-inf", "infinity")


def config_from_dict(d: dict):
  """A config from its ``to_dict()`` (a heads_jax manifest), of the family it names."""
  return config_class(d.get("family", "bert")).from_dict(d)

ATTENTION_SETTINGS = ("auto", "explicit", "xla", "cudnn", "flash")
LAYER_NORM_DTYPES = ("compute", "float32")


def _or(value, default):
  return default if value is None else value


def config_for(size: str = "base", **overrides) -> BertConfig:
  """The config of a size variant (``SIZES``), with any field overridden."""
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
  layers, heads, hidden, ffn = SIZES[size]
  base = dict(num_layers=layers, num_heads=heads, hidden_size=hidden, intermediate_size=ffn)
  base.update(overrides)
  return BertConfig(**base)
