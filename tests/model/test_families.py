"""Model families as configurations of one encoder: RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA,
ALBERT (and BERT) against transformers' PyTorch models (eager attention).

Every model is a random-weight transformers model that the test builds and saves with
``save_pretrained`` (tests/family_models.py; nothing downloads). Attention maps must agree within
1e-5 on real positions, hidden states and logits too; export back to Hugging Face must load in
the family's transformers class with the same outputs and the same state dict.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch==2.13.0 (pip install -e .[test])")
transformers = pytest.importorskip("transformers")

from flax import nnx

from heads_jax import load_model
from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_SEP
from heads_jax.data.encoding import AnalysisExample, Segment, encode_batch
from heads_jax.model.bert import BertModel, sinusoidal_table
from heads_jax.model.config import FAMILIES, BertConfig
from heads_jax.model.convert import export_hf, hf_architecture, hf_state_dict
from heads_jax.model.heads import BertForPreTraining, BertForSequenceClassification
from tests.family_models import HF_CLASS, build_hf_model, build_tokenizer, random_inputs, save_family_dir

TOL = 1e-5
OTHER = ("roberta", "xlm-roberta", "distilbert", "electra", "albert")
# (family, transformers config overrides): the switches each family turns.
VARIANTS = [
    ("bert", {}),
    ("roberta", {}),
    ("xlm-roberta", {}),
    ("distilbert", {}),                                    # learned positions
    ("distilbert", {"sinusoidal_pos_embds": True}),
    ("electra", {}),                                       # embedding 16 -> hidden 32 projection
    ("electra", {"embedding_size": 32}),                   # no projection
    ("albert", {}),                                        # 4 layers in 2 shared groups
    ("albert", {"num_hidden_groups": 1, "inner_group_num": 2}),  # 2 x (2 inner layers), one group
]
PAD = {"roberta": 1, "xlm-roberta": 1}


def _hf_inputs(family, ids, mask, segments):
  kw = {"input_ids": torch.tensor(ids, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long)}
  if family in ("bert", "electra", "albert"):  # the families with token types
    kw["token_type_ids"] = torch.tensor(segments, dtype=torch.long)
  return kw


def _hf_run(hf, family, ids, mask, segments):
  with torch.no_grad():
    return hf(**_hf_inputs(family, ids, mask, segments), output_attentions=True,
              output_hidden_states=True)


def compare(ours, theirs, mask, *, hidden=True) -> float:
  """Asserts attention (and hidden state) parity on real positions; returns the largest
  attention difference."""
  att = np.asarray(ours["attentions"])
  assert att.shape[1] == len(theirs.attentions)
  worst = 0.0
  for layer, a in enumerate(theirs.attentions):
    a = a.numpy()
    for b in range(len(mask)):
      n = int(mask[b].sum())
      diff = np.abs(att[b, layer, :, :n, :n] - a[b, :, :n, :n]).max()
      worst = max(worst, float(diff))
      assert diff <= TOL, (layer, b, diff)
      assert np.all(att[b, layer, :, :n, n:] == 0)
  if hidden:
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(ours["last_hidden_state"])[real],
                               theirs.last_hidden_state.numpy()[real], atol=TOL, rtol=0)
    hs = np.asarray(ours["hidden_states"])
    assert len(hs) == len(theirs.hidden_states)
    for i, h in enumerate(theirs.hidden_states):
      np.testing.assert_allclose(hs[i][real], h.numpy()[real], atol=TOL, rtol=0, err_msg=f"hidden {i}")
  return worst


@pytest.mark.slow
@pytest.mark.parametrize("family,overrides", VARIANTS,
                         ids=[f + "".join(f"-{k}={v}" for k, v in o.items()) for f, o in VARIANTS])
def test_encoder_attention_parity(tmp_path, family, overrides):
  hf = build_hf_model(family, 120, seed=1, **overrides)
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, with_tokenizer=False)
  cfg = model.config
  assert cfg.family == family and type(model) is BertModel
  ids, mask, segments = random_inputs(np.random.default_rng(0), b=4, k=20, vocab=120,
                                      pad_id=PAD.get(family, 0))
  ours = model(ids, mask, segments, return_attentions=True, return_hidden_states=True)
  theirs = _hf_run(hf, family, ids, mask, segments)
  worst = compare(ours, theirs, mask)
  print(f"{family} {overrides}: largest attention difference {worst:.2e}")
  if "pooled" in ours or getattr(theirs, "pooler_output", None) is not None:
    np.testing.assert_allclose(np.asarray(ours["pooled"]), theirs.pooler_output.numpy(), atol=TOL)
  # The configuration says what differs, and nothing is copied per family.
  if family == "albert":
    assert len(model.layers) == hf.config.num_hidden_groups * hf.config.inner_group_num
    assert cfg.num_layers == hf.config.num_hidden_layers * hf.config.inner_group_num
  else:
    assert len(model.layers) == cfg.num_layers
  assert (model.embeddings.projection is not None) == (cfg.embed_dim != cfg.hidden_size or family == "albert")
  assert (model.embeddings.token_type is None) == (family == "distilbert")
  assert (model.pooler is None) == (family in ("distilbert", "electra"))
  assert cfg.position_offset == (2 if family in PAD else 0)


@pytest.mark.parametrize("family", ["bert", *OTHER])
def test_sequence_classifier_parity(tmp_path, family):
  """The family's own classifier head (pooler, dense+tanh, dense+gelu, pre_classifier+relu)."""
  hf = build_hf_model(family, 120, task="ForSequenceClassification", seed=2, num_labels=3)
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, head="auto", with_tokenizer=False)
  assert type(model) is BertForSequenceClassification and model.num_labels == 3
  ids, mask, segments = random_inputs(np.random.default_rng(1), b=3, k=12, vocab=120,
                                      pad_id=PAD.get(family, 0))
  ours = model(ids, mask, segments, return_attentions=True)
  with torch.no_grad():
    theirs = hf(**_hf_inputs(family, ids, mask, segments), output_attentions=True)
  np.testing.assert_allclose(np.asarray(ours["logits"]), theirs.logits.numpy(), atol=TOL, rtol=0)
  compare(ours, theirs, mask, hidden=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", OTHER)
def test_export_round_trip_through_transformers(tmp_path, family):
  """A heads_jax model of the family exported to Hugging Face loads in the family's transformers
  class with the same outputs and parameters, and loads back unchanged."""
  hf_cfg = build_hf_model(family, 90).config.to_dict()
  cfg = BertConfig.from_hf_dict(hf_cfg)
  assert BertConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
  ids, mask, segments = random_inputs(np.random.default_rng(2), b=3, k=14, vocab=90,
                                      pad_id=PAD.get(family, 0))
  for ours in (BertModel(cfg, rngs=nnx.Rngs(3)), BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(4))):
    arch = type(ours).__name__
    out_dir = export_hf(ours, None, tmp_path / arch)
    written = json.loads((out_dir / "config.json").read_text())
    assert written["architectures"] == [hf_architecture(arch, cfg)]
    assert written["architectures"][0].startswith(HF_CLASS[family])
    hf = getattr(transformers, written["architectures"][0]).from_pretrained(
        out_dir, attn_implementation="eager").eval()
    hf_sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    mine = hf_state_dict(ours)
    for k, v in mine.items():
      np.testing.assert_array_equal(hf_sd[k], v, err_msg=k)
    # Every parameter transformers has (apart from buffers and tied copies) comes from us.
    params = {n for n, _ in hf.named_parameters()}
    assert params <= set(mine), sorted(params - set(mine))[:5]
    got = ours(ids, mask, segments, return_attentions=True)
    with torch.no_grad():
      theirs = hf(**_hf_inputs(family, ids, mask, segments), output_attentions=True)
    compare(got, theirs, mask, hidden=False)
    if arch == "BertForSequenceClassification":
      np.testing.assert_allclose(np.asarray(got["logits"]), theirs.logits.numpy(), atol=TOL)
    again, _ = load_model(out_dir, head="auto", with_tokenizer=False)
    assert type(again) is type(ours) and again.config == cfg
    for k, v in hf_state_dict(again).items():
      np.testing.assert_array_equal(v, mine[k], err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", *OTHER])
def test_text_pairs_through_each_tokenizer(tmp_path, family):
  """Real text through the family's tokenizer: heads_jax's encoding (segments per DESIGN.md
  section 3) gives the model the same attention as transformers on the tokenizer's own output,
  and the template's special positions are found."""
  hf, tok = save_family_dir(family, tmp_path, seed=3)
  model, loaded = load_model(tmp_path)
  assert type(loaded).__name__ == (type(tok).__name__ if family not in ("distilbert", "electra")
                                   else "BertTokenizer")
  pairs = [("The quick brown fox jumps over the lazy dog.", "It was not amused, they said."),
           ("Researchers want to know what each attention head does.", "Heads differ.")]
  batch = encode_batch([AnalysisExample(Segment.from_text(a), Segment.from_text(b)) for a, b in pairs],
                       loaded, max_length=48)
  # Families with token types get them from the tokenizer (transformers 5's AlbertTokenizer no
  # longer returns them by default, but ALBERT was trained with them); the others get none.
  has_types = family in ("bert", "electra", "albert")
  enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="np",
            return_token_type_ids=has_types)
  k = enc["input_ids"].shape[1]
  assert batch["input_ids"].shape[1] == k
  np.testing.assert_array_equal(batch["input_ids"] * batch["attention_mask"],
                                enc["input_ids"] * enc["attention_mask"])
  mask = batch["attention_mask"]
  if has_types:  # the segments are the token types
    np.testing.assert_array_equal(batch["token_type_ids"], enc["token_type_ids"] * mask)
  for i in range(len(pairs)):
    n = int(mask[i].sum())
    ids = batch["input_ids"][i, :n].tolist()
    specials = [j for j, t in enumerate(ids) if t in (tok.cls_token_id, tok.sep_token_id)]
    seps = specials[1:]
    assert specials[0] == 0 and ids[0] == tok.cls_token_id
    assert len(seps) == (3 if family in ("roberta", "xlm-roberta") else 2)
    np.testing.assert_array_equal(batch["token_class"][i, specials], [TOKEN_CLS] + [TOKEN_SEP] * len(seps))
    # Segment 0: the start token, A and the first separator; 1: the rest.
    seg = batch["token_type_ids"][i, :n]
    assert seg[:seps[0] + 1].tolist() == [0] * (seps[0] + 1) and seg[seps[0] + 1:].all()
  ours = model(batch["input_ids"], mask, batch["token_type_ids"], return_attentions=True,
               return_hidden_states=True)
  with torch.no_grad():
    theirs = hf(**{k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()},
                output_attentions=True, output_hidden_states=True)
  compare(ours, theirs, mask)


def test_distilbert_sinusoidal_init_and_max_lengths():
  """DistilBERT's sinusoidal table as transformers builds it; RoBERTa's offset costs positions."""
  from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
  ref = create_sinusoidal_embeddings(40, 16, torch.empty(40, 16)).numpy()
  np.testing.assert_allclose(sinusoidal_table(40, 16), ref, atol=1e-6)
  cfg = BertConfig(family="distilbert", hidden_size=16, num_heads=2, num_layers=1, intermediate_size=8,
                   max_position_embeddings=40, type_vocab_size=0, pooler=False, sinusoidal_positions=True)
  model = BertModel(cfg, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(model.embeddings.position.embedding[...]), ref, atol=1e-6)
  roberta = BertConfig(family="roberta", max_position_embeddings=514, position_offset=2, type_vocab_size=1)
  assert roberta.max_positions == 512
  roberta.check_max_length(512)
  from heads_jax.errors import UserError
  with pytest.raises(UserError, match="exceeds the model's 512 positions"):
    roberta.check_max_length(513)


def test_family_limits_are_clear_errors(tmp_path):
  roberta = BertConfig.from_hf_dict(build_hf_model("roberta", 60).config.to_dict())
  with pytest.raises(ValueError, match="pre-training heads .* bert family only"):
    BertForPreTraining(roberta, rngs=nnx.Rngs(0))
  cfg = json.loads(json.dumps(build_hf_model("bert", 60).config.to_dict()))
  cfg["model_type"] = "gpt2"
  with pytest.raises(ValueError, match="model_type is 'gpt2'; heads_jax loads albert, bert, distilbert"):
    BertConfig.from_hf_dict(cfg)
  assert set(FAMILIES) == {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert"}


def test_heads_jax_directories_move_between_encoder_and_classifier(tmp_path):
  """A fine-tuned RoBERTa classifier (no pooler) saved as a heads_jax directory loads as the
  encoder the analysis needs, and an encoder directory loads as a classifier."""
  from heads_jax.model.checkpoint import save_model
  cfg = BertConfig.from_hf_dict(build_hf_model("roberta", 90).config.to_dict())
  clf = BertForSequenceClassification(cfg, 3, rngs=nnx.Rngs(0))
  save_model(clf, tmp_path / "clf")
  enc, _ = load_model(tmp_path / "clf", with_tokenizer=False)
  ids, mask, seg = random_inputs(np.random.default_rng(0), b=2, k=10, vocab=90, pad_id=1)
  np.testing.assert_allclose(np.asarray(enc(ids, mask, seg, return_attentions=True)["attentions"]),
                             np.asarray(clf(ids, mask, seg, return_attentions=True)["attentions"]), atol=1e-6)
  save_model(BertModel(cfg, rngs=nnx.Rngs(1)), tmp_path / "enc")
  again, _ = load_model(tmp_path / "enc", head="classification", num_labels=2, with_tokenizer=False)
  assert type(again) is BertForSequenceClassification and again.pre_classifier is not None
