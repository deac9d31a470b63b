"""Span QA head of every family against transformers' ``*ForQuestionAnswering`` (random tiny
models, tests.family_models): import parity within 1e-5, export that transformers loads with the
same parameters and logits, and the heads_jax model directory round trip."""

import json

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax.model.checkpoint import load_model_dir, save_model  # noqa: E402
from heads_jax.model.config import BertConfig  # noqa: E402
from heads_jax.model.convert import export_hf, hf_state_dict  # noqa: E402
from heads_jax.model.heads import BertForQuestionAnswering  # noqa: E402
from heads_jax.model.loading import load_model  # noqa: E402
from tests.family_models import FAMILIES, HF_CLASS, build_hf_model, random_inputs  # noqa: E402

TOL = 1e-5
PAD = {"roberta": 1, "xlm-roberta": 1}


def _hf_logits(hf, family, ids, mask, segments):
  kw = {"input_ids": torch.tensor(ids, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long)}
  if family in ("bert", "electra", "albert"):  # the families with token types
    kw["token_type_ids"] = torch.tensor(segments, dtype=torch.long)
  with torch.no_grad():
    out = hf(**kw)
  return out.start_logits.numpy(), out.end_logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_import_parity(tmp_path, family):
  hf = build_hf_model(family, 120, task="ForQuestionAnswering", seed=3)
  hf.save_pretrained(tmp_path)
  model, _ = load_model(tmp_path, head="auto", with_tokenizer=False)
  assert type(model) is BertForQuestionAnswering
  ids, mask, segments = random_inputs(np.random.default_rng(4), b=3, k=12, vocab=120,
                                      pad_id=PAD.get(family, 0))
  out = model(ids, mask, segments)
  start, end = _hf_logits(hf, family, ids, mask, segments)
  assert out["start_logits"].shape == (3, 12) and out["end_logits"].shape == (3, 12)
  real = mask > 0  # RoBERTa gives padding the pad position; padding logits are never read
  np.testing.assert_allclose(np.asarray(out["start_logits"])[real], start[real], atol=TOL, rtol=0)
  np.testing.assert_allclose(np.asarray(out["end_logits"])[real], end[real], atol=TOL, rtol=0)
  # the span head differs from the logits of a fresh head: it was really read
  fresh = BertForQuestionAnswering(model.config, rngs=nnx.Rngs(9))
  assert not np.allclose(np.asarray(fresh.qa_outputs.kernel[...]),
                         np.asarray(model.qa_outputs.kernel[...]))


@pytest.mark.parametrize("family", FAMILIES)
def test_export_loads_in_transformers(tmp_path, family):
  cfg = BertConfig.from_hf_dict(build_hf_model(family, 90).config.to_dict())
  ours = BertForQuestionAnswering(cfg, rngs=nnx.Rngs(5))
  out_dir = export_hf(ours, None, tmp_path / "hf")
  arch = json.loads((out_dir / "config.json").read_text())["architectures"]
  assert arch == [f"{HF_CLASS[family]}ForQuestionAnswering"]
  hf = getattr(transformers, arch[0]).from_pretrained(out_dir, attn_implementation="eager").eval()
  hf_sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  mine = hf_state_dict(ours)
  for k, v in mine.items():
    np.testing.assert_array_equal(hf_sd[k], v, err_msg=k)
  params = {n for n, _ in hf.named_parameters()}
  assert params <= set(mine), sorted(params - set(mine))[:5]   # no pooler, nothing left fresh
  assert {"qa_outputs.weight", "qa_outputs.bias"} <= set(mine)
  ids, mask, segments = random_inputs(np.random.default_rng(6), b=2, k=10, vocab=90,
                                      pad_id=PAD.get(family, 0))
  out = ours(ids, mask, segments)
  start, end = _hf_logits(hf, family, ids, mask, segments)
  real = mask > 0  # RoBERTa gives padding the pad position; padding logits are never read
  np.testing.assert_allclose(np.asarray(out["start_logits"])[real], start[real], atol=TOL, rtol=0)
  np.testing.assert_allclose(np.asarray(out["end_logits"])[real], end[real], atol=TOL, rtol=0)


def test_heads_jax_directory_round_trip_and_encoder_init(tmp_path):
  cfg = BertConfig.from_hf_dict(build_hf_model("bert", 80).config.to_dict())
  ours = BertForQuestionAnswering(cfg, rngs=nnx.Rngs(7))
  save_model(ours, tmp_path / "qa")
  back = load_model_dir(tmp_path / "qa")
  ids, mask, segments = random_inputs(np.random.default_rng(8), b=2, k=9, vocab=80)
  np.testing.assert_array_equal(np.asarray(back(ids, mask, segments)["start_logits"]),
                                np.asarray(ours(ids, mask, segments)["start_logits"]))
  # an encoder-only directory starts a QA model (the span head fresh), as fine-tuning does
  save_model(ours.bert, tmp_path / "enc")
  qa = load_model_dir(tmp_path / "enc", "BertForQuestionAnswering")
  np.testing.assert_array_equal(np.asarray(qa(ids, mask, segments)["last_hidden_state"]),
                                np.asarray(ours(ids, mask, segments)["last_hidden_state"]))
