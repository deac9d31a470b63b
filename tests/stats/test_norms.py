"""The norm pass (heads_jax.stats.norms), on each layer's map and map-free, against a loop over
transformers' value vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heads_jax.data import vocabulary as B
from heads_jax.model.loading import load_model
from heads_jax.stats.norms import make_norm_step, norm_weights, transformed_norms
from heads_jax.stats.parsing import predicted_heads
from heads_jax.stats.layerwise import batch_tables, reduce_layer
from tests import reference_impl as ref
from tests.family_models import build_hf_model


# family -> (the layers, the value projection and the output dense of a layer) in transformers
HF_LAYERS = {
    "bert": (lambda hf: hf.encoder.layer, lambda l: l.attention.self.value,
             lambda l: l.attention.output.dense),
    "roberta": (lambda hf: hf.encoder.layer, lambda l: l.attention.self.value,
                lambda l: l.attention.output.dense),
    "distilbert": (lambda hf: hf.transformer.layer, lambda l: l.attention.v_lin,
                   lambda l: l.attention.out_lin),
}
PAD = {"roberta": 1}


def _hf_norm_weights(hf, batch, family="bert"):
  """Per layer: attention [b, h, q, k], ||f_h(x_k)|| [b, h, k] by a loop over heads with the
  value projection and output dense of transformers' model."""
  ids = torch.tensor(batch["input_ids"], dtype=torch.long)
  kw = {"attention_mask": torch.tensor(batch["attention_mask"], dtype=torch.long)}
  if family == "bert":
    kw["token_type_ids"] = torch.tensor(batch["token_type_ids"], dtype=torch.long)
  layers_of, value_of, output_of = HF_LAYERS[family]
  with torch.no_grad():
    out = hf(input_ids=ids, output_attentions=True, output_hidden_states=True, **kw)
    layers = []
    for i, layer in enumerate(layers_of(hf)):
      v = value_of(layer)(out.hidden_states[i]).numpy()                   # [b, k, d]
      wo = output_of(layer).weight.numpy()                               # [d_out, d_in]
      h = hf.config.num_attention_heads if family != "distilbert" else hf.config.n_heads
      e = v.shape[-1] // h
      fx = np.zeros((v.shape[0], h, v.shape[1]))
      ctx_norm = np.zeros((v.shape[0], h, v.shape[1]))
      a = out.attentions[i].numpy().astype(np.float64)
      for hh in range(h):
        f = v[:, :, hh * e:(hh + 1) * e] @ wo[:, hh * e:(hh + 1) * e].T   # [b, k, d]
        fx[:, hh] = np.linalg.norm(f, axis=-1)
        ctx_norm[:, hh] = np.linalg.norm(np.einsum("bqk,bkd->bqd", a[:, hh], f), axis=-1)
      layers.append((a, fx, ctx_norm))
  return layers


# bert on both paths (each layer's map; map-free: the statistics kernel on augmented queries and
# keys, the key-block loop), distilbert's own projections on the first (RoBERTa is BERT's
# layer with another padding id: the pass reads the model's own values, issue 52)
@pytest.mark.slow
@pytest.mark.parametrize("family,map_free", [("bert", False), ("bert", True),
                                             ("distilbert", False)])
def test_norm_pass_matches_a_transformers_loop(tmp_path, family, map_free):
  hf = build_hf_model(family, 120, seed=3)
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, with_tokenizer=False)
  rng = np.random.default_rng(0)
  batch = ref.random_batch(rng, 3, 12, min_len=5)
  real = batch["attention_mask"] > 0
  batch["input_ids"] = np.where(real, batch["input_ids"] % 110 + 5, PAD.get(family, 0)).astype(np.int32)
  if family != "bert":
    batch["token_type_ids"] = np.zeros_like(batch["token_type_ids"])  # no token types there
  roles = B.ROLES
  out = make_norm_step(model, roles=roles, map_free=map_free)(batch)
  layers = _hf_norm_weights(hf, batch, family)
  L, H = len(layers), layers[0][0].shape[1]
  b, k = batch["input_ids"].shape
  w = np.zeros((b, L, H, k, k))
  for i, (a, fx, ctx_norm) in enumerate(layers):
    for s in range(b):
      n = int(real[s].sum())
      for h in range(H):
        for q in range(n):
          row = a[s, h, q, :n] * fx[s, h, :n]
          w[s, i, h, q, :n] = row / row.sum()
        # sinks: mean over queries of the attention on position 0 and on each [SEP]
        np.testing.assert_allclose(out["first_attention"][s, i, h], a[s, h, :n, 0].mean(), rtol=1e-4)
        seps = [t for t in range(n) if batch["token_class"][s, t] == B.TOKEN_SEP]
        for j in range(2):
          if j < len(seps):
            np.testing.assert_allclose(out["sep_attention"][s, i, h, j], a[s, h, :n, seps[j]].mean(),
                                       rtol=1e-4, atol=1e-7)
          else:
            assert np.isnan(out["sep_attention"][s, i, h, j])
        ratio = ctx_norm[s, h, :n].mean() / fx[s, h, :n].mean()
        np.testing.assert_allclose(out["norm_ratio"][s, i, h], ratio, rtol=1e-4)
  expected = ref.sieve_bias(w, batch, roles)
  got = out["norm_sieve_bias"]
  assert got.shape == (b, L, H, len(roles))
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
  np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5, equal_nan=True)
  # massive activations: the hidden states' norms at position 0, the [SEP]s and the rest
  with torch.no_grad():
    kw = {"attention_mask": torch.tensor(batch["attention_mask"], dtype=torch.long)}
    if family == "bert":
      kw["token_type_ids"] = torch.tensor(batch["token_type_ids"], dtype=torch.long)
    states = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                output_hidden_states=True, **kw).hidden_states
  norms = np.stack([np.linalg.norm(x.numpy().astype(np.float64), axis=-1) for x in states], 1)
  assert out["hidden_norms"].shape == (b, L + 1, 3)
  for s in range(b):
    n = int(real[s].sum())
    seps = [t for t in range(n) if batch["token_class"][s, t] == B.TOKEN_SEP]
    rest = [t for t in range(1, n) if t not in seps]
    want = np.stack([norms[s, :, 0], norms[s][:, seps].mean(-1) if seps else np.full(L + 1, np.nan),
                     np.median(norms[s][:, rest], -1) if rest else np.full(L + 1, np.nan)], -1)
    np.testing.assert_allclose(out["hidden_norms"][s], want, rtol=1e-4)
  # each head's predicted word: predicted_heads on transformers' maps
  for i, (a, _, _) in enumerate(layers):
    want = np.asarray(predicted_heads(a.astype(np.float32), batch["word_ids"]))
    np.testing.assert_array_equal(out["parse_pred"][:, i], want)
  # norm weighting changes the scores (a check that the weights are not the attention)
  attention_bias = ref.sieve_bias(np.stack([l[0] for l in layers], 1), batch, roles)
  assert np.nanmax(np.abs(attention_bias - expected)) > 1e-2


@pytest.mark.slow
def test_values_zero_on_sep_lose_the_sep_role():
  """A head with 80% of each row on [SEP]: sep bias far above 3 under attention weights, 0 under
  norm weights when its value vectors are 0 on [SEP]."""
  n, k, h, e, d = 8, 10, 1, 4, 6
  batch = B.empty_batch(1, k)
  batch["attention_mask"][0, :n] = 1
  batch["token_class"][0, :n] = B.TOKEN_OTHER
  batch["token_class"][0, 0] = B.TOKEN_CLS
  batch["token_class"][0, n - 1] = B.TOKEN_SEP
  batch["word_ids"][0, 1:n - 1] = np.arange(n - 2)
  probs = np.zeros((1, h, k, k), np.float32)
  probs[0, 0, :n, :n] = 0.2 / (n - 1)
  probs[0, 0, :n, n - 1] = 0.8
  rng = np.random.default_rng(0)
  values = rng.normal(size=(1, k, h, e)).astype(np.float32)
  values[0, n - 1] = 0.0
  kernel = rng.normal(size=(h * e, d)).astype(np.float32)
  roles = ("sep", "cls", "local")
  tables = batch_tables(batch, roles)

  def bias(p):
    return np.asarray(reduce_layer(p, tables, roles, batch["attention_mask"])["sieve_bias"])[0, 0]

  fx = np.asarray(transformed_norms(values, kernel))
  np.testing.assert_allclose(fx[0, 0, :n], np.linalg.norm(values[0, :n, 0] @ kernel, axis=-1), rtol=1e-5)
  assert fx[0, 0, n - 1] == 0
  w = np.asarray(norm_weights(probs, fx, batch["attention_mask"]))
  np.testing.assert_allclose(w[0, 0, :n].sum(-1), 1.0, rtol=1e-6)
  assert bias(probs)[0] > 3
  assert bias(w)[0] == pytest.approx(0.0, abs=1e-7)
