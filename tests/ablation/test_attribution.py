"""Self-attention attribution and activation patching per head (issue 51 item 5): completeness of
integrated gradients, patching against a hand-written rerun, attribution patching exact on a
model linear in the head outputs, a planted head found first by both methods, and parity with
PyTorch transformers (hooks on random weights)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from heads_jax.ablation import corrupt
from heads_jax.ablation.attribution import Attributor, check_steps, check_task_head, model_apply
from heads_jax.ablation.patching import Patcher, check_pairs, logit_difference, recorded
from heads_jax.errors import UserError
from heads_jax.model.config import config_for
from tests.helpers import random_batch


def _batch(seed=0, b=3, k=12):
  ids, mask, types = random_batch(np.random.default_rng(seed), b=b, k=k, vocab=99)
  return {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(mask),
          "token_type_ids": jnp.asarray(types)}


# A small attention model written out by hand: the same two intervention points as the encoder.
def _toy_apply(params, batch, *, edit_probs=None, edit_context=None, return_attentions=False):
  x = params["emb"][batch["input_ids"]]
  mask = batch["attention_mask"]
  atts = []
  for l, lp in enumerate(params["layers"]):
    q, k, v = (jnp.einsum("bqd,dhe->bqhe", x, lp[n]) for n in ("q", "k", "v"))
    s = jnp.where(mask[:, None, None, :] > 0, jnp.einsum("bqhe,bkhe->bhqk", q, k), -1e9)
    p = jax.nn.softmax(s, -1)
    if edit_probs is not None:
      p = edit_probs(l, p)
    atts.append(p)
    ctx = jnp.einsum("bhqk,bkhe->bqhe", p, v)
    if edit_context is not None:
      ctx = edit_context(l, ctx)
    x = x + jnp.einsum("bqhe,hed->bqd", ctx, lp["o"])
  out = {"logits": x[:, 0] @ params["cls"]}
  if return_attentions:
    out["attentions"] = jnp.stack(atts, 1)
  return out


def test_attribution_patching_equals_patching_on_a_model_linear_in_the_head_outputs():
  # zero queries and keys: uniform attention whatever the input, so the logits are linear in
  # every head's output and the first-order estimate is exact
  rng = np.random.default_rng(0)
  d, h, e = 6, 3, 2
  layer = lambda: {"q": np.zeros((d, h, e)), "k": np.zeros((d, h, e)),  # noqa: E731
                   "v": rng.normal(size=(d, h, e)), "o": rng.normal(size=(h, e, d))}
  params = jax.tree.map(jnp.float32, {"emb": rng.normal(size=(20, d)), "cls": rng.normal(size=(d, 2)),
                                      "layers": [layer(), layer()]})
  ids = rng.integers(1, 20, size=(4, 7))
  clean = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones((4, 7), jnp.int32),
           "token_type_ids": jnp.zeros((4, 7), jnp.int32)}
  corrupted = dict(clean, input_ids=jnp.asarray(rng.integers(1, 20, size=(4, 7))))
  r = Patcher(_toy_apply, params).batch(clean, corrupted)
  np.testing.assert_allclose(r["estimated"], r["patched"], atol=1e-4)


def _planted():
  """Two layers of two heads; head (1, 1) reads the label word from [CLS] and alone writes the
  feature the classifier reads (dimension 5); the others move filler features (dimension 3),
  which the classifier reads 0.1 as much."""
  d, h, e = 6, 2, 1
  emb = np.zeros((10, d))
  emb[0, 0] = 1                       # [CLS]
  emb[1, [1, 4]] = [1, 1]             # a positive word
  emb[2, [1, 4]] = [-1, 1]            # a negative word
  emb[3:, 2] = np.linspace(0.5, 1.5, 7)   # fillers
  def layer(planted):
    w = {n: np.zeros((d, h, e)) for n in ("q", "k", "v")}
    o = np.zeros((h, e, d))
    w["v"][2, :, 0] = 1.0
    o[:, 0, 3] = 1.0                  # every head moves the filler feature to dimension 3
    if planted:
      w["q"][0, 1, 0], w["k"][4, 1, 0] = 4.0, 4.0   # [CLS] looks at the label word
      w["v"][:, 1, 0] = 0
      w["v"][1, 1, 0] = 1.0
      o[1, 0, :] = 0
      o[1, 0, 5] = 2.0
    return {**w, "o": o}
  cls = np.zeros((d, 2))
  cls[5] = [1, -1]
  cls[3] = [0.1, -0.1]
  return jax.tree.map(jnp.float32, {"emb": emb, "cls": cls, "layers": [layer(False), layer(True)]})


def _random_toy(seed=0, d=6, h=3, e=2):
  rng = np.random.default_rng(seed)
  layer = lambda: {n: rng.normal(size=(d, h, e)) for n in "qkv"} | {"o": rng.normal(size=(h, e, d)) / 2}  # noqa: E731
  return jax.tree.map(jnp.float32, {"emb": rng.normal(size=(20, d)), "cls": rng.normal(size=(d, 2)),
                                    "layers": [layer(), layer()]})


@pytest.mark.slow
def test_integrated_gradients_are_complete_within_the_riemann_error():
  # a layer's attributions summed over its heads and token pairs -> F(A) - F(0 at that layer);
  # the left Riemann sum's error is O(1/m): 16x the steps, about 1/16 of the error
  params = _random_toy()
  ids = np.random.default_rng(1).integers(1, 20, size=(4, 7))
  batch = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray((ids > 2).astype(np.int32)),
           "token_type_ids": jnp.zeros(ids.shape, jnp.int32)}
  errors = {}
  for m in (2, 32):
    r = Attributor(_toy_apply, params, steps=m, objective="logit").batch(batch)
    gap = r["value"][:, None] - r["baseline"]                           # [b, l]
    errors[m] = np.abs(r["total"] - gap).max()
  assert np.abs(gap).max() > 0.1
  assert errors[32] < errors[2] / 8 and errors[32] < 0.1 * np.abs(gap).max()
  with pytest.raises(UserError, match="m >= 1"):
    check_steps(0)


@pytest.mark.slow
def test_a_planted_head_that_carries_the_label_is_found_first_by_both_methods():
  params = _planted()
  rng = np.random.default_rng(3)
  ids = np.concatenate([np.zeros((8, 1), int), rng.integers(3, 10, size=(8, 6))], 1)
  ids[np.arange(8), 1 + rng.integers(0, 6, size=8)] = np.where(np.arange(8) % 2, 1, 2)
  clean = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones(ids.shape, jnp.int32),
           "token_type_ids": jnp.zeros(ids.shape, jnp.int32)}
  flipped = np.where(ids == 1, 2, np.where(ids == 2, 1, ids))
  corrupted = dict(clean, input_ids=jnp.asarray(flipped))
  attr = Attributor(_toy_apply, params, steps=20).batch(clean)["importance"].mean(0)
  p = Patcher(_toy_apply, params).batch(clean, corrupted)
  gap = np.mean(p["corrupted"] - p["clean"])
  for effect in (attr, p["patched"].mean(0) / gap, p["estimated"].mean(0) / gap):
    assert np.unravel_index(np.argmax(effect), effect.shape) == (1, 1)
  assert p["patched"].mean(0)[1, 1] / gap > 0.9


def test_corrupted_rows_keep_the_positions_and_a_set_of_another_length_is_refused(tmp_path):
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.data.glue_batches import encode_texts
  tok = load_tokenizer(None)
  data = encode_texts(tok, ["a good film", "a bad one here", "fine"],
                      ["it was fun", "no", "really quite dull"], max_length=32,
                      pad_to_max_length=False)
  for how in ("mask", "swap"):
    c = corrupt.corrupted_rows(data, tok, how, share=0.5)
    assert (c["attention_mask"] == data["attention_mask"]).all()
    special = np.isin(data["input_ids"], tok.all_special_ids)
    assert (c["input_ids"][special] == data["input_ids"][special]).all()
    assert (c["input_ids"] != data["input_ids"]).any(1).all()   # every row changed
    check_pairs(data, c)
  (tmp_path / "c.tsv").write_text("sentence1\tsentence2\na good film\tit was fun\n")
  short = corrupt.corrupted_rows(data, tok, "tsv", tsv=tmp_path / "c.tsv", pair=True)
  with pytest.raises(UserError, match="the corrupted set has 1 rows, the clean set 3"):
    check_pairs(data, short)
  (tmp_path / "c.tsv").write_text("sentence1\tsentence2\n" + "a\tb\n" * 3)
  with pytest.raises(UserError, match="row 0: the corrupted text has 5 tokens, the clean 9"):
    check_pairs(data, corrupt.corrupted_rows(data, tok, "tsv", tsv=tmp_path / "c.tsv", pair=True))
  with pytest.raises(UserError, match="single sentences"):
    corrupt.swap_second(encode_texts(tok, ["a b", "c d"], None, max_length=8,
                                     pad_to_max_length=False), tok)


def test_a_model_without_a_task_head_is_refused():
  from heads_jax.model.bert import BertModel
  with pytest.raises(UserError, match="without a task head"):
    check_task_head(BertModel(config_for("tiny", vocab_size=99), rngs=nnx.Rngs(0)))


@pytest.mark.slow
def test_attribution_and_patching_match_pytorch_transformers_and_a_rerun(tmp_path, monkeypatch):
  # the torch twin of tests/model/test_parity.py (random weights, eager attention): layer 1's
  # attention replaced through transformers' eager_attention_forward, a head's output through a
  # pre-hook on the attention's output projection; and patching one head equal to a
  # hand-written rerun with that head's output replaced (no vmap, no traced layer)
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from transformers.models.bert import modeling_bert
  from heads_jax import load_model
  torch.manual_seed(0)
  cfg = transformers.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=128,
                                max_position_embeddings=40, attn_implementation="eager")
  hf = transformers.BertForSequenceClassification(cfg).eval()
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, head="auto", with_tokenizer=False)
  graphdef, state = nnx.split(model)
  apply = model_apply(graphdef)
  clean = _batch(2, b=2, k=10)
  corrupted = dict(clean, input_ids=jnp.where(clean["attention_mask"] > 0, 9, 0))
  t = lambda b: {"input_ids": torch.tensor(np.asarray(b["input_ids"]), dtype=torch.long),  # noqa: E731
                 "attention_mask": torch.tensor(np.asarray(b["attention_mask"]), dtype=torch.long),
                 "token_type_ids": torch.tensor(np.asarray(b["token_type_ids"]), dtype=torch.long)}
  layer, steps = 1, 4
  ours = Attributor(apply, state, steps=steps, objective="probability")
  jax_maps = ours.batch(clean, maps=2)["maps"][:, layer]                  # [b, h, q, k]
  with torch.no_grad():
    out = hf(**t(clean), output_attentions=True)
  A, pred = out.attentions[layer], out.logits.argmax(-1)
  original = modeling_bert.eager_attention_forward
  grads = torch.zeros_like(A)
  for i in range(steps):
    x = (i / steps * A).clone().requires_grad_(True)

    def replaced(module, query, key, value, attention_mask, *args, **kw):
      o, w = original(module, query, key, value, attention_mask, *args, **kw)
      if module.layer_idx == layer:
        o, w = torch.matmul(x, value).transpose(1, 2).contiguous(), x
      return o, w
    monkeypatch.setattr(modeling_bert, "eager_attention_forward", replaced)
    prob = torch.softmax(hf(**t(clean)).logits, -1)[torch.arange(2), pred].sum()
    grads += torch.autograd.grad(prob, x)[0]
  monkeypatch.setattr(modeling_bert, "eager_attention_forward", original)
  theirs = (A * grads / steps).numpy()
  mask = np.asarray(clean["attention_mask"])
  for b in range(2):
    n = int(mask[b].sum())
    np.testing.assert_allclose(jax_maps[b, :, :n, :n], theirs[b, :, :n, :n], atol=2e-5)
  # patching head 3 of layer 0: its output (the context slice entering the output projection)
  r = Patcher(apply, state).batch(clean, corrupted)
  e = cfg.hidden_size // cfg.num_attention_heads
  dense = hf.bert.encoder.layer[0].attention.output.dense
  saved = {}
  hook = dense.register_forward_pre_hook(lambda mod, args: saved.setdefault("ctx", args[0]))
  with torch.no_grad():
    hf(**t(corrupted))
  hook.remove()

  def put(mod, args):
    x = args[0].clone()
    x[..., 3 * e:4 * e] = saved["ctx"][..., 3 * e:4 * e]
    return (x,)
  hook = dense.register_forward_pre_hook(put)
  with torch.no_grad():
    z = hf(**t(clean)).logits.numpy()
  hook.remove()
  pair = np.asarray(r["pair"])
  ld = z[np.arange(2), pair[:, 0]] - z[np.arange(2), pair[:, 1]]
  np.testing.assert_allclose(r["patched"][:, 0, 3] + r["clean"], ld, atol=1e-4)
  _, ctx = recorded(apply, state, corrupted)
  base = logit_difference(apply(state, clean), r["pair"])

  def rerun(state, ctx, layer, head):
    def edit(l, c):
      return c.at[:, :, head].set(ctx[layer][:, :, head]) if l == layer else c
    return logit_difference(apply(state, clean, edit_context=edit), r["pair"])

  rerun = jax.jit(rerun, static_argnums=(2, 3))
  for layer, head in ((0, 2), (1, 0)):
    np.testing.assert_allclose(r["patched"][:, layer, head],
                               rerun(state, ctx, layer, head) - base, atol=1e-5)
  np.testing.assert_allclose(r["corrupted"], logit_difference(apply(state, corrupted), r["pair"]),
                             atol=1e-5)


@pytest.mark.slow   # four families' programs compiled (5-16 s each)
@pytest.mark.parametrize("family", ["modernbert", "deberta-v2", "albert", "distilbert"])
def test_every_family_attributes_and_patches_through_its_own_attention(family):
  # the families that do not run BERT's layers as they are (ModernBERT's windows and RoPE,
  # DeBERTa's relative terms, ALBERT's shared layers, DistilBERT's own layout) take the same
  # two intervention points (model.attention.AttentionHooks): on a tiny random classifier of
  # each, the attributions of each layer sum to F(A) - F(0 at that layer) within the left
  # Riemann error (smaller with more steps), and attribution patching follows patching to first
  # order (one token corrupted)
  import dataclasses
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.checkpoint import build_model
  from heads_jax.model.config import config_from_hf_dict
  from heads_jax.model.tiny import tiny_hf_config
  # weights large enough that attention moves the logits (the default 0.02 barely does)
  cfg = dataclasses.replace(config_from_hf_dict(tiny_hf_config(family, load_tokenizer())),
                            initializer_range=0.1)
  model = build_model("BertForSequenceClassification", cfg, num_labels=2, seed=1)
  assert check_task_head(model) == "classifier"
  graphdef, state = nnx.split(model)
  apply = model_apply(graphdef)
  batch = _batch(4, b=3, k=12)
  errors = {}
  for m in (2, 16):
    r = Attributor(apply, state, steps=m, objective="logit").batch(batch)
    gap = r["value"][:, None] - r["baseline"]                           # [b, l]
    errors[m] = np.abs(r["total"] - gap).max()
  assert r["total"].shape == gap.shape == (3, cfg.num_layers)
  assert np.abs(gap).max() > 1e-2
  assert errors[16] < errors[2] and errors[16] < 0.2 * np.abs(gap).max() + 1e-5
  ids = np.asarray(batch["input_ids"]).copy()
  ids[:, 2] = 7                        # one token changed: the first-order estimate is close
  p = Patcher(apply, state).batch(batch, dict(batch, input_ids=jnp.asarray(ids)))
  assert p["patched"].shape == p["estimated"].shape == (3, cfg.num_layers, cfg.num_heads)
  assert np.isfinite(p["patched"]).all() and np.abs(p["patched"]).max() > 0
  assert np.corrcoef(p["patched"].ravel(), p["estimated"].ravel())[0, 1] > 0.99
