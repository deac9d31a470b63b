"""Tiny random models of every family, written by ``heads-jax tiny-model``: a way to try each
family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT, ModernBERT, DeBERTa-v3) offline,
with nothing downloaded.

`write_tiny_model(family, out)` builds the family's Hugging Face ``config.json`` fields (through
transformers' own config class, so every field a real checkpoint has is there), reads them as
heads_jax reads a downloaded model's (`config.config_from_hf_dict`), initialises the encoder
with random weights and writes a heads_jax model directory with the embedded WordPiece
vocabulary (``analyze --model OUT`` takes it). Sizes: hidden 32, 4 heads, 2 layers (ALBERT: 4
applied layers in 2 groups; ModernBERT: 4 layers, global / local / local / global, a window of
16). Random weights: every score is noise; a model to run the commands on, not to read.
"""

from __future__ import annotations

from pathlib import Path

TINY_FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert",
                 "modernbert", "deberta-v2")


def tiny_hf_config(family: str, tokenizer) -> dict:
  """The Hugging Face config fields of a tiny ``family`` model for ``tokenizer``'s vocabulary
  and special ids."""
  import transformers
  from heads_jax.model.config import ALL_FAMILIES
  if family not in TINY_FAMILIES:
    raise ValueError(f"family {family!r}: one of {', '.join(TINY_FAMILIES)}")
  pad, cls, sep = tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id
  kw = dict(vocab_size=len(tokenizer), max_position_embeddings=512, pad_token_id=pad,
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
  if family == "distilbert":
    kw = dict(vocab_size=len(tokenizer), max_position_embeddings=512, pad_token_id=pad, dim=32,
              n_layers=2, n_heads=4, hidden_dim=64)
  elif family in ("roberta", "xlm-roberta"):   # positions start after the padding id
    kw.update(max_position_embeddings=512 + pad + 1, type_vocab_size=1, bos_token_id=cls,
              eos_token_id=sep)
  elif family == "electra":
    kw.update(embedding_size=16)
  elif family == "albert":
    kw.update(embedding_size=16, num_hidden_layers=4, num_hidden_groups=2, inner_group_num=1)
  elif family == "modernbert":
    kw.update(num_hidden_layers=4, intermediate_size=48, local_attention=16,
              global_attn_every_n_layers=3, cls_token_id=cls, sep_token_id=sep,
              bos_token_id=cls, eos_token_id=sep)
  elif family == "deberta-v2":
    kw.update(relative_attention=True, position_buckets=8, max_relative_positions=64,
              pos_att_type="p2c|c2p", share_att_key=True, position_biased_input=False,
              norm_rel_ebd="layer_norm", type_vocab_size=0, layer_norm_eps=1e-7)
  model_type = ALL_FAMILIES[family].model_type
  return transformers.AutoConfig.for_model(model_type, **kw).to_dict()


def write_tiny_model(family: str, out, *, seed: int = 0) -> Path:
  """Writes a tiny random ``family`` encoder with the embedded vocabulary to ``out`` (a heads_jax
  model directory); returns ``out``."""
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.checkpoint import build_model, save_model
  from heads_jax.model.config import config_from_hf_dict
  tokenizer = load_tokenizer()
  cfg = config_from_hf_dict(tiny_hf_config(family, tokenizer))
  return save_model(build_model("BertModel", cfg, seed=seed), out, tokenizer)
