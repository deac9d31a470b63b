"""BERT configuration and the size variants, in one table.

Field names follow the paper/JAX world; ``from_hf_dict`` / ``to_hf_dict`` translate to and
from a Hugging Face ``config.json``.
"""

from __future__ import annotations

import dataclasses
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
class BertConfig:
  """Hyper-parameters of a post-LN BERT encoder (defaults: BERT-base uncased)."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  initializer_range: float = 0.02
  hidden_act: str = "gelu"  # "gelu" (exact erf, as BERT) or "gelu_new"/"gelu_tanh"
  dtype: str = "float32"    # compute dtype; parameters, softmax and LayerNorm stay float32
  pad_token_id: int = 0

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.hidden_act not in _ACTS:
      raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; use one of {sorted(_ACTS)}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  def check_max_length(self, max_length: int) -> None:
    """Refuses (UserError) sequences of ``max_length`` positions that the position embeddings
    cannot hold; call it before encoding any data."""
    if max_length > self.max_position_embeddings:
      raise UserError(f"--max-length {max_length} exceeds the model's {self.max_position_embeddings} "
                      f"positions (max_position_embeddings); use --max-length "
                      f"{self.max_position_embeddings} or less")

  def replace(self, **kw) -> "BertConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "BertConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})

  def to_hf_dict(self) -> dict:
    """The Hugging Face ``BertConfig`` dictionary for ``config.json``."""
    return {
        "architectures": ["BertModel"], "model_type": "bert",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "intermediate_size": self.intermediate_size, "hidden_act": self.hidden_act,
        "hidden_dropout_prob": self.hidden_dropout,
        "attention_probs_dropout_prob": self.attention_dropout,
        "max_position_embeddings": self.max_position_embeddings,
        "type_vocab_size": self.type_vocab_size, "initializer_range": self.initializer_range,
        "layer_norm_eps": self.layer_norm_eps, "pad_token_id": self.pad_token_id,
        "position_embedding_type": "absolute",
    }

  @classmethod
  def from_hf_dict(cls, d: dict) -> "BertConfig":
    """Reads a Hugging Face BERT ``config.json`` dictionary."""
    if d.get("model_type", "bert") != "bert":
      raise ValueError(f"model_type is {d.get('model_type')!r}; heads_jax loads BERT models only")
    pet = d.get("position_embedding_type", "absolute")
    if pet != "absolute":
      raise ValueError(f"position_embedding_type {pet!r} is not supported (only 'absolute')")
    act = d.get("hidden_act", "gelu")
    return cls(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        num_layers=d["num_hidden_layers"], num_heads=d["num_attention_heads"],
        intermediate_size=d["intermediate_size"],
        max_position_embeddings=d.get("max_position_embeddings", 512),
        type_vocab_size=d.get("type_vocab_size", 2),
        layer_norm_eps=d.get("layer_norm_eps", 1e-12),
        hidden_dropout=d.get("hidden_dropout_prob", 0.1),
        attention_dropout=d.get("attention_probs_dropout_prob", 0.1),
        initializer_range=d.get("initializer_range", 0.02),
        hidden_act=act, pad_token_id=d.get("pad_token_id", 0) or 0,
    )

  @classmethod
  def from_hf_file(cls, path) -> "BertConfig":
    return cls.from_hf_dict(json.loads(Path(path).read_text()))


_ACTS = {"gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu"}


def config_for(size: str = "base", **overrides) -> BertConfig:
  """The config of a size variant (``SIZES``), with any field overridden."""
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
  layers, heads, hidden, ffn = SIZES[size]
  base = dict(num_layers=layers, num_heads=heads, hidden_size=hidden, intermediate_size=ffn)
  base.update(overrides)
  return BertConfig(**base)
