"""DeBERTa-v3 (``deberta-v2``) against transformers' PyTorch ``DebertaV2Model`` (eager attention).

Every model is a random-weight transformers model built here (biases and LayerNorms moved off
their initial values) and saved with ``save_pretrained``; its tokenizer is a Unigram model
trained here on UD EWT text and written as DeBERTa-v3 ships it, a SentencePiece ``spm.model``
(nothing downloads). Attention maps must agree within 1e-5 on real positions, hidden states too;
``heads-jax convert`` must go both ways and come back to the same parameters.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch (pip install -e .[test])")
transformers = pytest.importorskip("transformers")

from flax import nnx

from heads_jax import load_model
from heads_jax.cli import main as cli_main
from heads_jax.data.encoding import AnalysisExample, Segment, encode_batch
from heads_jax.data.spm import read_spm, tokenizer_from_spm_dir
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_SEP
from heads_jax.model.convert import hf_state_dict
from heads_jax.model.deberta import (TERMS, DebertaConfig, DebertaForSequenceClassification,
                                     DebertaModel, log_bucket_position, relative_rows,
                                     term_variance_shares)
from tests.family_models import corpus, random_inputs

TOL = 1e-5
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]   # DeBERTa-v3's spm.model: ids 0..3
# (name, transformers config overrides): DeBERTa-v3 as released (shared position keys, log
# buckets), separate position projections, and DeBERTa-v2's other switches (absolute positions,
# token types, an embedding projection, c2p only, no buckets: clamped offsets).
VARIANTS = {
    "v3": {},
    "separate-keys": {"share_att_key": False},
    "v2-switches": {"position_biased_input": True, "type_vocab_size": 2, "embedding_size": 16,
                    "pos_att_type": "c2p", "position_buckets": -1, "max_relative_positions": 12,
                    "norm_rel_ebd": "none", "share_att_key": False},
}


@functools.lru_cache(maxsize=1)
def spm_pieces() -> tuple[tuple[str, float], ...]:
  """A Unigram vocabulary (piece, score) trained on ``corpus()``, DeBERTa-v3's specials first."""
  from tokenizers import SentencePieceUnigramTokenizer
  sp = SentencePieceUnigramTokenizer()
  sp.train_from_iterator(list(corpus()), vocab_size=600, special_tokens=SPECIALS, unk_token="[UNK]")
  # scores as float32: what a SentencePiece model file stores
  return tuple((p, float(np.float32(s))) for p, s in json.loads(sp._tokenizer.to_str())["model"]["vocab"])


def write_spm_dir(path) -> None:
  """Writes ``spm.model`` (a SentencePiece ModelProto, as the hub's DeBERTa-v3 ships) and
  ``tokenizer_config.json`` to ``path``."""
  from transformers.utils import sentencepiece_model_pb2_new as pb
  proto = pb.ModelProto()
  for piece, score in spm_pieces():
    p = proto.pieces.add()
    p.piece, p.score = piece, score
    p.type = 2 if piece == "[UNK]" else 3 if piece in SPECIALS else 1  # UNKNOWN, CONTROL, NORMAL
  proto.trainer_spec.model_type = 1  # UNIGRAM
  proto.trainer_spec.unk_id = SPECIALS.index("[UNK]")
  path.mkdir(parents=True, exist_ok=True)
  (path / "spm.model").write_bytes(proto.SerializeToString())
  (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm"}))


def hf_config(vocab_size: int, **overrides):
  """A tiny DeBERTa-v3 config (2 layers x 4 heads, hidden 32, buckets of 8 up to 64 positions so
  that sequences of 20+ tokens reach the log buckets), eager attention."""
  kw = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, relative_attention=True,
            position_buckets=8, max_relative_positions=64, pos_att_type="p2c|c2p",
            share_att_key=True, position_biased_input=False, norm_rel_ebd="layer_norm",
            type_vocab_size=0, pad_token_id=0, layer_norm_eps=1e-7, attn_implementation="eager")
  kw.update(overrides)
  return transformers.DebertaV2Config(**kw)


def build_hf(vocab_size: int, *, task: str = "Model", seed: int = 0, num_labels: int = 2,
             **overrides):
  torch.manual_seed(seed)
  cfg = hf_config(vocab_size, **overrides)
  if task == "ForSequenceClassification":
    cfg.num_labels = num_labels
  model = getattr(transformers, f"DebertaV2{task}")(cfg)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def save_deberta_dir(path, *, task: str = "Model", seed: int = 0, **overrides):
  """A random DeBERTa-v3 directory as the hub has one (config.json, weights, spm.model,
  tokenizer_config.json); returns ``(hf_model, tokenizer)``."""
  write_spm_dir(path)
  tok = tokenizer_from_spm_dir(path)
  hf = build_hf(len(tok), task=task, seed=seed, **overrides)
  hf.save_pretrained(path)
  return hf, tok


def _hf_run(hf, ids, mask, segments=None):
  kw = {"input_ids": torch.tensor(ids, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long)}
  if segments is not None and hf.config.type_vocab_size > 0:
    kw["token_type_ids"] = torch.tensor(segments, dtype=torch.long)
  with torch.no_grad():
    return hf(**kw, output_attentions=True, output_hidden_states=True)


def compare(ours, theirs, mask, *, hidden=True) -> float:
  """Asserts attention (and hidden-state) parity on real positions; the largest difference."""
  att = np.asarray(ours["attentions"])
  assert att.shape[1] == len(theirs.attentions)
  worst = 0.0
  for layer, a in enumerate(theirs.attentions):
    a = a.numpy()
    for b in range(len(mask)):
      n = int(mask[b].sum())
      diff = float(np.abs(att[b, layer, :, :n, :n] - a[b, :, :n, :n]).max())
      worst = max(worst, diff)
      assert diff <= TOL, (layer, b, diff)
      assert np.all(att[b, layer, :, :n, n:] == 0) and np.all(att[b, layer, :, n:] == 0)
  if hidden:
    real = mask.astype(bool)
    hs = np.asarray(ours["hidden_states"])
    assert len(hs) == len(theirs.hidden_states)
    for i, h in enumerate(theirs.hidden_states):
      np.testing.assert_allclose(hs[i][real], h.numpy()[real], atol=TOL, rtol=0, err_msg=f"hidden {i}")
    np.testing.assert_allclose(np.asarray(ours["last_hidden_state"])[real],
                               theirs.last_hidden_state.numpy()[real], atol=TOL, rtol=0)
  return worst


def test_log_buckets_are_transformers_buckets():
  from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
  rel = np.arange(-700, 701)
  for buckets, most in ((256, 512), (8, 64), (6, 20)):
    theirs = make_log_bucket_position(torch.tensor(rel), buckets, most).long().numpy()
    np.testing.assert_array_equal(log_bucket_position(rel, buckets, most), theirs)
  # Offsets inside half the bucket count stay exact; beyond they grow logarithmically.
  # Offsets up to max_position - 1 fill the 2 x 256 rows; longer ones are clamped to the last row
  # (relative_rows).
  rel = np.arange(-511, 512)
  got = log_bucket_position(rel, 256, 512)
  inside = np.abs(rel) < 128
  np.testing.assert_array_equal(got[inside], rel[inside])
  assert got.max() == 255 and got.min() == -255 and np.all(np.diff(got) >= 0)
  cfg = DebertaConfig(num_layers=1, num_heads=1, hidden_size=8, intermediate_size=8)
  rows = relative_rows(cfg, 600)
  assert rows.min() == 0 and rows.max() == 511 and rows[0, 0] == 256 and rows[599, 0] == 511


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encoder_attention_parity(tmp_path, variant):
  """Single sentences of 40 tokens (past the bucket size) with right padding, and pairs with
  token types where the model has them: every attention map within 1e-5, hidden states too."""
  hf = build_hf(120, seed=1, **VARIANTS[variant])
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, with_tokenizer=False)
  assert type(model) is DebertaModel and model.config.family == "deberta-v2"
  cfg = model.config
  assert (model.embeddings.position is None) == (not hf.config.position_biased_input)
  assert (model.layers[0].attention.pos_key is None) == hf.config.share_att_key
  ids, mask, segments = random_inputs(np.random.default_rng(0), b=4, k=40, vocab=120)
  ours = model(ids, mask, segments, return_attentions=True, return_hidden_states=True)
  worst = compare(ours, _hf_run(hf, ids, mask, segments), mask)
  print(f"deberta {variant}: largest attention difference {worst:.2e}")
  # The fused path (positional terms as the bias of jax.nn.dot_product_attention) gives the same
  # hidden states.
  fused = model(ids, mask, segments, attention="xla")
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(fused["last_hidden_state"])[real],
                             np.asarray(ours["last_hidden_state"])[real], atol=TOL, rtol=0)
  assert cfg.scale_factor == 1 + len(hf.config.pos_att_type)


@pytest.mark.slow
def test_terms_are_transformers_terms_and_shares_their_variance():
  """c2p and p2c each equal transformers' own ``disentangled_attention_bias`` restricted to that
  term; c2c + c2p + p2c gives transformers' attention; the shares are the covariance
  decomposition computed by hand, and they sum to 1."""
  hf = build_hf(90, seed=4)
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  cfg = DebertaConfig.from_hf_dict(hf.config.to_dict())
  model = DebertaModel(cfg, rngs=nnx.Rngs(0))
  from heads_jax.model.convert import assign_params, flat_params
  from heads_jax.model.deberta import hf_key
  values = {}
  for path in flat_params(model):
    key, transpose = hf_key(path, cfg)
    values[path] = sd[key].T if transpose else sd[key]
  assign_params(model, values)
  ids, mask, _ = random_inputs(np.random.default_rng(5), b=2, k=24, vocab=90)
  theirs = _hf_run(hf, ids, mask)
  x = np.asarray(model(ids, mask, return_hidden_states=True)["hidden_states"][0])
  att = model.layers[0].attention
  b, q, d = x.shape
  split = lambda y: np.asarray(y).reshape(b, q, cfg.num_heads, cfg.head_dim)  # noqa: E731
  qh, kh = split(att.query(x)), split(att.key(x))
  rel = model.relative_embeddings()
  c2p, p2c = (np.asarray(t) for t in att.terms(qh, kh, rel, relative_rows(cfg, q)))
  c2c = np.einsum("bqhe,bkhe->bhqk", qh, kh) / np.sqrt(cfg.head_dim * 3)
  # transformers, one term at a time (its scale factor stays 3, as in the model).
  them = hf.encoder.layer[0].attention.self
  hs = torch.tensor(x)
  to_heads = lambda y: them.transpose_for_scores(y, cfg.num_heads)  # noqa: E731
  with torch.no_grad():
    tq, tk = to_heads(them.query_proj(hs)), to_heads(them.key_proj(hs))
    rel_pos = hf.encoder.get_rel_pos(hs)
    rel_emb = hf.encoder.get_rel_embedding()
    for term, ours in (("c2p", c2p), ("p2c", p2c)):
      them.pos_att_type = [term]
      bias = them.disentangled_attention_bias(tq, tk, rel_pos, rel_emb, 3).numpy()
      np.testing.assert_allclose(ours.reshape(bias.shape), bias, atol=1e-6, err_msg=term)
    them.pos_att_type = ["p2c", "c2p"]
  logits = c2c + c2p + p2c
  key_real = mask[:, None, None, :] > 0
  probs = np.exp(logits - logits.max(-1, keepdims=True)) * key_real
  probs /= probs.sum(-1, keepdims=True)
  for i in range(b):
    n = int(mask[i].sum())
    np.testing.assert_allclose(probs[i, :, :n, :n], theirs.attentions[0][i, :, :n, :n].numpy(), atol=TOL)
  # The shares by hand: per real query, covariances over the real keys, summed over queries.
  shares = np.asarray(term_variance_shares([c2c, c2p, p2c], mask))
  for i in range(b):
    n = int(mask[i].sum())
    terms = [t[i, :, :n, :n].astype(np.float64) for t in (c2c, c2p, p2c)]
    centred = [t - t.mean(-1, keepdims=True) for t in terms]
    total = sum(centred)
    expect = np.stack([(c * total).sum((-1, -2)) for c in centred], -1) / (total ** 2).sum((-1, -2))[:, None]
    np.testing.assert_allclose(shares[i], expect, atol=1e-5)
  np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-5)
  out = model(ids, mask, return_term_shares=True)
  assert out["term_shares"].shape == (b, cfg.num_layers, cfg.num_heads, len(TERMS))
  np.testing.assert_allclose(np.asarray(out["term_shares"])[:, 0], shares, atol=1e-6)
  # An absent term has share 0; a one-token sequence has no variance (NaN).
  one = np.asarray(term_variance_shares([c2c, None, p2c], np.eye(1, 24, dtype=np.int32).repeat(2, 0)))
  assert np.isnan(one).all()
  no_c2p = np.asarray(term_variance_shares([c2c, None, p2c], mask))
  assert np.all(no_c2p[..., 1] == 0) and np.allclose(no_c2p.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_sequence_classifier_parity(tmp_path):
  """The classifier as transformers defines it: ContextPooler (first position, dense, gelu) and
  a linear layer."""
  hf = build_hf(120, task="ForSequenceClassification", seed=2, num_labels=3)
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, head="auto", with_tokenizer=False)
  assert type(model) is DebertaForSequenceClassification and model.num_labels == 3
  ids, mask, _ = random_inputs(np.random.default_rng(1), b=3, k=12, vocab=120)
  ours = model(ids, mask, return_attentions=True)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), output_attentions=True)
  np.testing.assert_allclose(np.asarray(ours["logits"]), theirs.logits.numpy(), atol=TOL, rtol=0)
  compare(ours, theirs, mask, hidden=False)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["Model", "ForSequenceClassification"])
def test_convert_both_ways(tmp_path, task):
  """``heads-jax convert``: Hugging Face -> heads_jax -> Hugging Face keeps every parameter and
  the tokenizer; transformers loads the result with the same attention."""
  hf, tok = save_deberta_dir(tmp_path / "hf", task=task, seed=6, share_att_key=False)
  assert cli_main(["convert", str(tmp_path / "hf"), str(tmp_path / "hj")]) == 0
  assert (tmp_path / "hj" / "heads_jax.json").is_file()
  assert cli_main(["convert", str(tmp_path / "hj"), str(tmp_path / "back")]) == 0
  back = getattr(transformers, f"DebertaV2{task}").from_pretrained(
      tmp_path / "back", attn_implementation="eager").eval()
  theirs = {k: v.numpy() for k, v in hf.state_dict().items()}
  again = {k: v.numpy() for k, v in back.state_dict().items()}
  params = {n for n, _ in hf.named_parameters()}
  for k in params:
    np.testing.assert_array_equal(again[k], theirs[k], err_msg=k)
  model, loaded = load_model(tmp_path / "hj", head="auto")
  assert type(model) is (DebertaModel if task == "Model" else DebertaForSequenceClassification)
  assert set(hf_state_dict(model)) >= params
  ids, mask, _ = random_inputs(np.random.default_rng(3), b=2, k=30, vocab=len(tok))
  compare(model(ids, mask, return_attentions=True), _hf_run(back, ids, mask), mask, hidden=False)
  assert loaded(["one text"]).input_ids == tok(["one text"]).input_ids
  assert load_tokenizer(tmp_path / "back")("one text").input_ids == tok("one text").input_ids


@pytest.mark.slow
def test_spm_tokenizer_and_pairs_through_the_model(tmp_path):
  """The hub's spm.model read without sentencepiece gives transformers' DebertaV2Tokenizer on the
  same pieces; heads_jax's encoding of pairs is the tokenizer's ([CLS] A [SEP] B [SEP]) and the
  model's attention on it is transformers'."""
  hf, tok = save_deberta_dir(tmp_path, seed=3)
  pieces, unk = read_spm(tmp_path / "spm.model")
  assert tuple(pieces) == spm_pieces() and unk == 3
  reference = transformers.DebertaV2Tokenizer(vocab=list(spm_pieces()), unk_id=3)
  texts = ["The quick brown fox jumps over the lazy dog.", "Researchers want to know what heads do."]
  model, loaded = load_model(tmp_path)
  for t in (tok, loaded):
    assert t.is_fast and t(texts).input_ids == reference(texts).input_ids
  pairs = [(texts[0], "It was not amused, they said."), (texts[1], "Heads differ.")]
  batch = encode_batch([AnalysisExample(Segment.from_text(a), Segment.from_text(b)) for a, b in pairs],
                       loaded, max_length=48)
  enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="np")
  mask = batch["attention_mask"]
  np.testing.assert_array_equal(batch["input_ids"] * mask, enc["input_ids"] * enc["attention_mask"])
  for i in range(len(pairs)):
    n = int(mask[i].sum())
    ids = batch["input_ids"][i, :n].tolist()
    specials = [j for j, t in enumerate(ids) if t in (tok.cls_token_id, tok.sep_token_id)]
    assert specials[0] == 0 and len(specials) == 3 and specials[-1] == n - 1
    np.testing.assert_array_equal(batch["token_class"][i, specials], [TOKEN_CLS] + [TOKEN_SEP] * 2)
  ours = model(batch["input_ids"], mask, batch["token_type_ids"], return_attentions=True,
               return_hidden_states=True)
  compare(ours, _hf_run(hf, enc["input_ids"], enc["attention_mask"]), mask)


# microsoft/deberta-v3-base's config.json as published (the fields it sets).
DEBERTA_V3_BASE = {"model_type": "deberta-v2", "attention_probs_dropout_prob": 0.1,
                   "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
                   "initializer_range": 0.02, "intermediate_size": 3072,
                   "max_position_embeddings": 512, "relative_attention": True,
                   "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                   "pos_att_type": "p2c|c2p", "layer_norm_eps": 1e-7,
                   "max_relative_positions": -1, "position_biased_input": False,
                   "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 0,
                   "vocab_size": 128100}


def test_deberta_v3_base_config():
  """The released model's config reads as the defaults say, and its shapes are transformers'."""
  from heads_jax.model.config import config_from_hf_dict
  cfg = config_from_hf_dict(DEBERTA_V3_BASE)
  assert cfg == DebertaConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)
  assert (cfg.span, cfg.relative_max, cfg.scale_factor) == (256, 512, 3)
  model = nnx.eval_shape(lambda: DebertaModel(cfg, rngs=nnx.Rngs(0)))
  hf = transformers.DebertaV2Config(**DEBERTA_V3_BASE)
  with torch.device("meta"):
    theirs = transformers.DebertaV2Model(hf)
  shapes = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
  from heads_jax.model.deberta import hf_key
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  ours = {"/".join(map(str, p)): v.shape for p, v in flat}
  assert len(ours) == len([k for k in shapes if "position_ids" not in k])
  for path, shape in ours.items():
    key, transpose = hf_key(path, cfg)
    assert shapes[key] == (tuple(reversed(shape)) if transpose else tuple(shape)), key


@pytest.mark.slow
def test_clear_errors():
  with pytest.raises(ValueError, match="conv_kernel_size"):
    DebertaConfig.from_hf_dict({**hf_config(50).to_dict(), "conv_kernel_size": 3})
  with pytest.raises(ValueError, match="pos_att_type"):
    DebertaConfig(pos_att_type=("c2c",))
  cfg = DebertaConfig.from_hf_dict(hf_config(50).to_dict())
  assert DebertaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
  assert DebertaConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
  model = DebertaModel(cfg, rngs=nnx.Rngs(0))
  ids = np.ones((1, 5), np.int32)
  with pytest.raises(ValueError, match="cuDNN"):
    model(ids, attention="cudnn")
  reduce = lambda *a: None  # noqa: E731
  reduce.needs_probs = False  # a reduction that recomputes the logits from query and key
  with pytest.raises(ValueError, match="not query . key"):
    model(ids, attention_reduce=reduce)
  with pytest.raises(ValueError, match="segment_removal must have shape"):
    model(ids, segment_removal=np.zeros((2, 4)))


@pytest.mark.slow
def test_gates_and_bfloat16():
  """The analysis' and ablations' switches act on DeBERTa as on BERT: a "uniform" gate of 0
  makes a head uniform over the real keys, a "remove" gate of 0 is the head's removal, and
  bfloat16 compute stays near float32."""
  cfg = DebertaConfig.from_hf_dict(hf_config(60).to_dict())
  model = DebertaModel(cfg, rngs=nnx.Rngs(1))
  ids, mask, _ = random_inputs(np.random.default_rng(7), b=2, k=20, vocab=60)
  gate = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
  gate[1, 2] = 0.0
  att = np.asarray(model(ids, mask, head_gate=gate, gate_mode="uniform", return_attentions=True)["attentions"])
  for b in range(2):
    n = int(mask[b].sum())
    np.testing.assert_allclose(att[b, 1, 2, :n, :n], 1.0 / n, atol=1e-7)
  base = model(ids, mask, return_attentions=True)
  removed = model(ids, mask, head_gate=gate, gate_mode="remove")
  assert not np.allclose(np.asarray(removed["last_hidden_state"]), np.asarray(base["last_hidden_state"]))
  # Guan et al.'s segment removal: a pair's intra-segment attention of head (0, 1) removed.
  segments = (np.arange(20)[None] >= 8).astype(np.int32).repeat(2, 0) * mask
  removal = np.zeros((cfg.num_layers, cfg.num_heads, 2), np.float32)
  removal[0, 1, 0] = 1.0
  cut = np.asarray(model(ids, mask, segments, segment_removal=removal, return_attentions=True)["attentions"])
  same = segments[:, :, None] == segments[:, None, :]
  assert np.all(cut[:, 0, 1][same] == 0)
  np.testing.assert_allclose(cut[:, 0, 1][~same], np.asarray(base["attentions"])[:, 0, 1][~same], atol=1e-7)
  from heads_jax.stats.step import with_compute_dtype
  low = with_compute_dtype(model, "bfloat16")(ids, mask, return_attentions=True)
  np.testing.assert_allclose(np.asarray(low["attentions"]), np.asarray(base["attentions"]), atol=3e-2)


def test_term_share_summary():
  """summary.json's term_shares: means over the sequences that have shares (a one-token
  sequence's NaN left out), per layer, and the heads whose positional terms carry most."""
  from heads_jax.hoststats.terms import term_share_summary
  shares = np.array([[[[0.2, 0.5, 0.3], [0.9, 0.05, 0.05]]],
                     [[[0.4, 0.3, 0.3], [np.nan, np.nan, np.nan]]]], np.float32)  # [2, 1, 2, 3]
  s = term_share_summary(shares, TERMS)
  assert s["terms"] == ["c2c", "c2p", "p2c"] and s["num_sequences"] == 2
  np.testing.assert_allclose(np.array(s["per_head"], float),
                             [[[0.3, 0.4, 0.3], [0.9, 0.05, 0.05]]], atol=1e-4)
  np.testing.assert_allclose(np.array(s["per_layer"], float), [[0.6, 0.225, 0.175]], atol=1e-4)
  assert s["positional_heads"] == ["0:0"] and s["content_heads"] == ["0:1"]
  json.dumps(s, allow_nan=False)


@pytest.mark.slow
def test_hub_id_loads_from_the_cache(tmp_path, monkeypatch):
  """A hub id in the local Hugging Face cache (HF_HOME, offline) whose snapshot is laid out as
  microsoft/deberta-v3-base's (config.json, weights, spm.model, tokenizer_config.json) loads with
  its tokenizer."""
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  commit = "0123456789abcdef0123456789abcdef01234567"
  repo = tmp_path / "hf_home" / "hub" / "models--microsoft--deberta-v3-tiny"
  hf, tok = save_deberta_dir(repo / "snapshots" / commit, seed=8)
  (repo / "refs").mkdir(parents=True)
  (repo / "refs" / "main").write_text(commit)
  assert not (repo / "snapshots" / commit / "tokenizer.json").exists()
  model, loaded = load_model("microsoft/deberta-v3-tiny")
  assert type(model) is DebertaModel and loaded("a text").input_ids == tok("a text").input_ids
  ids, mask, _ = random_inputs(np.random.default_rng(4), b=2, k=16, vocab=len(tok))
  compare(model(ids, mask, return_attentions=True), _hf_run(hf, ids, mask), mask, hidden=False)


@pytest.mark.slow
def test_every_statistics_path_serves_deberta(tmp_path):
  """The analysis step on DeBERTa: the stacked path (the model's attention maps) and the
  layerwise one give the same statistics and term shares; the kernels that recompute logits
  from query . key ("fused", "kernel") hand DeBERTa to the layerwise path instead of failing."""
  from heads_jax.stats.step import make_analysis_step
  _, tok = save_deberta_dir(tmp_path, seed=9)
  model, tok = load_model(tmp_path)
  texts = [("The quick brown fox jumps over the lazy dog.", "It was not amused."),
           ("Heads differ, and so do their terms.", "Yes.")]
  batch = encode_batch([AnalysisExample(Segment.from_text(a), Segment.from_text(b)) for a, b in texts],
                       tok, max_length=32)
  outs = {impl: make_analysis_step(model, measures=True, stats_impl=impl)(batch)
          for impl in ("stacked", "layerwise", "fused")}
  for impl in ("layerwise", "fused"):
    for key in ("sieve_bias", "distance", "entropy", "term_shares"):
      np.testing.assert_allclose(outs[impl][key], outs["stacked"][key], atol=1e-5, err_msg=(impl, key))
  assert outs["stacked"]["term_shares"].shape == (2, 2, 4, 3)
