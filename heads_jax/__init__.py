"""heads_jax: BERT attention-head analysis in JAX/Flax.

Public API (kept stable):

    from heads_jax import load_model
    model, tokenizer = load_model(path)   # Hugging Face dir (BERT, RoBERTa, XLM-R, DistilBERT,
                                          # ELECTRA, ALBERT), hub id in the HF cache, heads_jax dir
    out = model(input_ids, attention_mask=..., token_type_ids=..., return_attentions=True)
    out["attentions"]                     # float32 [b, l, h, q, k]
"""

__version__ = "0.1.0"


def load_model(path, **kwargs):
  """Loads an encoder and its tokenizer; see `heads_jax.model.loading.load_model`."""
  from heads_jax.model.loading import load_model as _load_model
  return _load_model(path, **kwargs)


__all__ = ["load_model", "__version__"]
