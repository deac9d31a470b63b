"""ModernBERT against transformers' ModernBertModel (eager attention, random weights with the
norms moved off 1): hidden states and every attention map on sequences longer than the local
window and on text pairs; the classifier; conversion both ways; the window and the uniform
gate; the registry's errors."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from heads_jax.model.checkpoint import save_model  # noqa: E402
from heads_jax.model.config import config_from_hf_dict  # noqa: E402
from heads_jax.model.loading import convert_dir, load_model  # noqa: E402
from heads_jax.model.modernbert import (ModernBertConfig, ModernBertForSequenceClassification,  # noqa: E402
                                        ModernBertModel, window_mask)
from tests.family_models import build_hf_model, random_inputs, save_family_dir  # noqa: E402

VOCAB = 700


def _hf_attentions(hf, ids, mask):
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
             attention_mask=torch.tensor(mask, dtype=torch.long), output_attentions=True)
  attn = torch.stack(out.attentions, dim=1).numpy()                     # [b, l, h, q, k]
  return out.last_hidden_state.numpy(), attn * mask[:, None, None, :, None]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("modernbert")
  hf, tok = save_family_dir("modernbert", d, seed=3)
  return d, hf, tok


@pytest.mark.slow
def test_encoder_hidden_states_and_attention_match_transformers(model_dir):
  d, hf, _ = model_dir
  model, tok = load_model(d)
  assert isinstance(model, ModernBertModel) and model.config.windows == (None, 4, 4, None)
  ids, mask, _ = random_inputs(np.random.default_rng(0), b=3, k=30, vocab=VOCAB, pad_id=5)
  hidden, attn = _hf_attentions(hf, ids, mask)
  out = model(ids, attention_mask=mask, return_attentions=True)
  ours = np.asarray(out["attentions"])
  np.testing.assert_allclose(ours, attn, atol=1e-5)
  real = mask > 0
  np.testing.assert_allclose(np.asarray(out["last_hidden_state"])[real], hidden[real], atol=1e-4)
  # Local layers: exactly 0 outside |i - j| <= 4 (the sequences are 30 > the window's 9 keys).
  outside = ~window_mask(model.config, 30)[1]
  assert ours[:, 1][..., outside].max() == 0 and ours[:, 0][..., outside].max() > 0
  # Rows of real queries sum to 1 (row 0 has no padding).
  np.testing.assert_allclose(ours[0].sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_pairs_encode_as_transformers_and_match(model_dir):
  d, hf, _ = model_dir
  model, tok = load_model(d)
  first = ["the cat sat on the mat while the dog slept by the door of the old house",
           "a short one"]
  second = ["and then it rained for a long time", "an answer that is longer than the window"]
  enc = tok(first, second, padding=True, return_tensors="np")
  ref = transformers.AutoTokenizer.from_pretrained(str(d))(first, second, padding=True,
                                                          return_tensors="np")
  np.testing.assert_array_equal(enc["input_ids"], ref["input_ids"])
  toks = tok.convert_ids_to_tokens(enc["input_ids"][0])
  assert toks[0] == "[CLS]" and toks.count("[SEP]") == 2 and toks[-1] == "[SEP]"
  ids, mask = enc["input_ids"], enc["attention_mask"]
  assert ids.shape[1] > 9
  hidden, attn = _hf_attentions(hf, ids, mask)
  out = model(ids, attention_mask=mask, return_attentions=True)
  np.testing.assert_allclose(np.asarray(out["attentions"]), attn, atol=1e-5)


@pytest.mark.slow
def test_fused_path_and_reduce_hook_agree_with_explicit(model_dir):
  d, _, _ = model_dir
  model, _ = load_model(d, with_tokenizer=False)
  ids, mask, _ = random_inputs(np.random.default_rng(1), b=2, k=24, vocab=VOCAB, pad_id=5)
  explicit = model(ids, attention_mask=mask, attention="explicit")["last_hidden_state"]
  fused = model(ids, attention_mask=mask, attention="xla")["last_hidden_state"]
  real = mask > 0
  np.testing.assert_allclose(np.asarray(fused)[real], np.asarray(explicit)[real], atol=1e-5)
  seen = model(ids, attention_mask=mask, return_attentions=True,
               attention_reduce=lambda layer, p, q, k, m: p.sum(-2))
  np.testing.assert_allclose(np.asarray(seen["attention_reduced"]),
                             np.asarray(seen["attentions"]).sum(-2), atol=1e-6)


@pytest.mark.slow
def test_uniform_gate_is_uniform_over_the_window(model_dir):
  d, _, _ = model_dir
  model, _ = load_model(d, with_tokenizer=False)
  ids, mask, _ = random_inputs(np.random.default_rng(2), b=1, k=20, vocab=VOCAB)
  gate = np.ones((4, 4), np.float32)
  gate[1, 2] = 0.0
  attn = np.asarray(model(ids, attention_mask=mask, head_gate=gate, gate_mode="uniform",
                          return_attentions=True)["attentions"])[0]
  visible = window_mask(model.config, 20)[1]
  np.testing.assert_allclose(attn[1, 2], visible / visible.sum(-1, keepdims=True), atol=1e-7)


@pytest.mark.slow
def test_classifier_matches_transformers(tmp_path):
  for pooling in ("cls", "mean"):
    hf, _ = save_family_dir("modernbert", tmp_path / pooling, task="ForSequenceClassification",
                            seed=4, classifier_pooling=pooling, num_labels=3)
    model, _ = load_model(tmp_path / pooling, head="auto", with_tokenizer=False)
    assert isinstance(model, ModernBertForSequenceClassification) and model.num_labels == 3
    ids, mask, _ = random_inputs(np.random.default_rng(5), b=3, k=16, vocab=VOCAB, pad_id=5)
    with torch.no_grad():
      ref = hf(input_ids=torch.tensor(ids, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids, mask)["logits"]), ref, atol=1e-5)


@pytest.mark.slow
def test_convert_both_ways_round_trips_through_transformers(model_dir, tmp_path):
  from heads_jax.cli import main as cli_main
  d, hf, tok = model_dir
  assert cli_main(["convert", str(d), str(tmp_path / "hj")]) == 0        # heads-jax convert
  assert (tmp_path / "hj" / "heads_jax.json").is_file()
  assert cli_main(["convert", str(tmp_path / "hj"), str(tmp_path / "hf")]) == 0
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert cfg["architectures"] == ["ModernBertModel"] and cfg["model_type"] == "modernbert"
  again = transformers.AutoModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager")
  ids, mask, _ = random_inputs(np.random.default_rng(6), b=2, k=25, vocab=VOCAB, pad_id=5)
  _, a = _hf_attentions(hf, ids, mask)
  _, b = _hf_attentions(again.eval(), ids, mask)
  np.testing.assert_allclose(b, a, atol=1e-6)
  # A classifier made here exports as transformers' ModernBertForSequenceClassification.
  clf = ModernBertForSequenceClassification(config_from_hf_dict(hf.config.to_dict()), 2,
                                            rngs=nnx.Rngs(0))
  save_model(clf, tmp_path / "clf", tok)
  convert_dir(tmp_path / "clf", tmp_path / "clf_hf")
  back = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / "clf_hf"), attn_implementation="eager").eval()
  with torch.no_grad():
    ref = back(input_ids=torch.tensor(ids, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(clf(ids, mask)["logits"]), ref, atol=1e-5)


@pytest.mark.slow
def test_config_round_trip_and_errors():
  hf_cfg = build_hf_model("modernbert", 100).config.to_dict()
  cfg = config_from_hf_dict(hf_cfg)
  assert isinstance(cfg, ModernBertConfig) and cfg.local_attention == 8 and cfg.global_every == 3
  assert config_from_hf_dict(cfg.to_hf_dict()) == cfg
  assert ModernBertConfig.from_dict(cfg.to_dict()) == cfg
  with pytest.raises(ValueError, match="not 'global every n layers"):
    config_from_hf_dict({**hf_cfg, "layer_types": ["sliding_attention"] * 4})
  with pytest.raises(Exception, match="--max-length 100 exceeds the model's 64 positions"):
    cfg.check_max_length(100)
  model = ModernBertModel(cfg.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  out = model(jnp.ones((1, 12), jnp.int32), return_attentions=True)
  assert out["attentions"].dtype == jnp.float32 and np.isfinite(np.asarray(out["attentions"])).all()


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_weights_beyond_the_configs_layers_are_refused(tmp_path, family):
  """A config.json with fewer layers than its weights is refused in one line, not analysed as a
  truncated model; a fresh classifier on an encoder checkpoint loads without a warning."""
  import warnings

  from heads_jax.errors import UserError
  save_family_dir(family, tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  n = cfg["num_hidden_layers"]
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)
    clf, _ = load_model(tmp_path, head="classification", num_labels=2, with_tokenizer=False)
  assert clf.num_labels == 2
  cfg["num_hidden_layers"] = n - 1
  cfg.pop("layer_types", None)
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(UserError, match=f"num_hidden_layers={n - 1} but the weights hold layer "
                                      f"{n - 1} too .*fix config.json or the weights"):
    load_model(tmp_path, with_tokenizer=False)


@pytest.mark.slow
def test_packed_rows_equal_the_sequences_alone(model_dir):
  """Two sequences packed in one row (segment_ids 1, 2; positions restarting) give each
  sequence's own attention maps and hidden states, local windows included; the analysis step
  takes packed batches from ModernBERT (stats.step.accepts_packing)."""
  from heads_jax.stats.step import accepts_packing
  d, _, _ = model_dir
  model, _ = load_model(d, with_tokenizer=False)
  assert accepts_packing(model)
  rng = np.random.default_rng(8)
  a, b = rng.integers(7, VOCAB, 12), rng.integers(7, VOCAB, 9)
  ids = np.concatenate([a, b, [5, 5, 5]])[None].astype(np.int32)
  mask = (np.arange(24) < 21).astype(np.int32)[None]
  seg = np.concatenate([np.ones(12), 2 * np.ones(9), np.zeros(3)]).astype(np.int32)[None]
  pos = np.concatenate([np.arange(12), np.arange(9), np.zeros(3)]).astype(np.int32)[None]
  packed = model(ids, attention_mask=mask, segment_ids=seg, position_ids=pos,
                 return_attentions=True)
  for x, span in ((a, slice(0, 12)), (b, slice(12, 21))):
    alone = model(x[None].astype(np.int32), return_attentions=True)
    np.testing.assert_allclose(np.asarray(packed["attentions"])[0][:, :, span, span],
                               np.asarray(alone["attentions"])[0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(packed["last_hidden_state"])[0, span],
                               np.asarray(alone["last_hidden_state"])[0], atol=1e-5)
  fused = model(ids, attention_mask=mask, segment_ids=seg, position_ids=pos, attention="xla")
  np.testing.assert_allclose(np.asarray(fused["last_hidden_state"])[0, :21],
                             np.asarray(packed["last_hidden_state"])[0, :21], atol=1e-5)
