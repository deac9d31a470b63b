"""The survey's measures (Clark et al. 2019, Kovaleva et al. 2019) against plain numpy / scipy."""

import numpy as np
import pytest

import jax
from flax import nnx
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy as scipy_entropy

from heads_jax.data import vocabulary as B
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.stats import measures
from tests.helpers import random_batch


def _attention(seed=0, b=3, l=2, h=3, k=9):
  """Random softmax rows over the real keys, padding keys and query rows 0; token classes with
  [CLS] at 0, [SEP] at the end, some commas / periods."""
  rng = np.random.default_rng(seed)
  lengths = np.array([k, k - 3, 4][:b])
  mask = (np.arange(k)[None] < lengths[:, None]).astype(np.int32)
  logits = rng.normal(size=(b, l, h, k, k)) * 2
  logits = np.where(mask[:, None, None, None, :] > 0, logits, -np.inf)
  att = np.exp(logits - logits.max(-1, keepdims=True))
  att = att / att.sum(-1, keepdims=True) * mask[:, None, None, :, None]
  cls = np.full((b, k), B.TOKEN_PAD, np.int32)
  for i, n in enumerate(lengths):
    cls[i, :n] = B.TOKEN_OTHER
    cls[i, 0], cls[i, n - 1] = B.TOKEN_CLS, B.TOKEN_SEP
    if n > 4:
      cls[i, 2], cls[i, n - 2] = B.TOKEN_COMMA, B.TOKEN_PERIOD
  return att.astype(np.float32), mask, cls


def test_entropy_and_token_attention_equal_loops():
  att, mask, cls = _attention()
  ent = np.asarray(jax.jit(measures.attention_entropy)(att, mask))
  cls_ent = np.asarray(measures.cls_entropy(att, mask))
  tok = np.asarray(measures.token_attention(att, cls, mask))
  b, l, h = att.shape[:3]
  assert tok.shape == (b, l, h, len(measures.TOKEN_MEASURES))
  for i in range(b):
    n = mask[i].sum()
    for j in range(l):
      for m in range(h):
        a = att[i, j, m, :n, :n].astype(np.float64)
        rows = [scipy_entropy(a[t]) for t in range(n)]
        assert ent[i, j, m] == pytest.approx(np.mean(rows), abs=1e-5)
        assert cls_ent[i, j, m] == pytest.approx(rows[0], abs=1e-5)
        c = cls[i, :n]
        want = [np.mean([a[t, c == B.TOKEN_CLS].sum() for t in range(n)]),
                np.mean([a[t, c == B.TOKEN_SEP].sum() for t in range(n)]),
                np.mean([a[t, (c == B.TOKEN_COMMA) | (c == B.TOKEN_PERIOD)].sum() for t in range(n)]),
                np.mean([a[t, t - 1] for t in range(1, n)]),
                np.mean([a[t, t + 1] for t in range(n - 1)])]
        np.testing.assert_allclose(tok[i, j, m], want, atol=1e-6)


def test_all_padding_row_gives_zeros():
  att, mask, cls = _attention()
  mask[1] = 0
  att[1] = 0
  cls[1] = B.TOKEN_PAD
  out = measures.all_measures(att, cls, mask, js=True)
  for key, value in out.items():
    assert np.all(np.asarray(value)[1] == 0), key
    assert np.all(np.isfinite(np.asarray(value))), key


def test_js_distances_equal_scipy_loop():
  att, mask, _ = _attention(seed=1)
  js = np.asarray(jax.jit(measures.js_distances)(att, mask))
  b, l, h = att.shape[:3]
  P = l * h
  assert js.shape == (b, P, P)
  np.testing.assert_array_equal(js, np.transpose(js, (0, 2, 1)))      # exactly symmetric
  assert np.all(js[:, np.arange(P), np.arange(P)] == 0)               # a head vs itself
  for i in range(b):
    n = mask[i].sum()
    flat = att[i].reshape(P, att.shape[3], att.shape[4])[:, :n, :n].astype(np.float64)
    for p in range(P):
      for q in range(P):
        want = np.mean([jensenshannon(flat[p, t], flat[q, t]) for t in range(n)])
        assert js[i, p, q] == pytest.approx(want, abs=2e-5)
  assert js.max() > 0.1


def test_js_of_nearly_identical_heads_is_small_and_accurate():
  att, mask, _ = _attention(seed=2, b=1, l=1, h=2)
  att[0, 0, 1] = att[0, 0, 0]
  att[0, 0, 1, :, 0] += 1e-4 * mask[0]
  att[0, 0, 1] /= np.where(mask[0][:, None] > 0, att[0, 0, 1].sum(-1, keepdims=True), 1)
  js = np.asarray(measures.js_distances(att, mask))[0]
  n = mask[0].sum()
  want = np.mean([jensenshannon(att[0, 0, 0, t, :n].astype(np.float64),
                                att[0, 0, 1, t, :n].astype(np.float64)) for t in range(n)])
  assert js[0, 1] == pytest.approx(want, rel=0.05)


def test_attention_cosine_equals_loop():
  a, mask, _ = _attention(seed=3)
  c, _, _ = _attention(seed=4)
  cos = np.asarray(measures.attention_cosine(a, c, mask))
  for i in range(a.shape[0]):
    n = mask[i].sum()
    for j in range(a.shape[1]):
      for m in range(a.shape[2]):
        x, y = a[i, j, m, :n, :n].ravel(), c[i, j, m, :n, :n].ravel()
        assert cos[i, j, m] == pytest.approx(x @ y / np.linalg.norm(x) / np.linalg.norm(y), abs=1e-6)
  np.testing.assert_allclose(measures.attention_cosine(a, a, mask), 1.0, atol=1e-6)


@pytest.mark.slow
def test_attention_similarity_of_two_models():
  from heads_jax.ablation.similarity import attention_similarity, similarity_table
  cfg = config_for("tiny", vocab_size=97, max_position_embeddings=32)
  m1, m2 = BertModel(cfg, rngs=nnx.Rngs(0)), BertModel(cfg, rngs=nnx.Rngs(1))
  ids, mask, types = random_batch(np.random.default_rng(0), b=5, k=10, vocab=97)
  batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
  same, n = attention_similarity(m1, m1, [batch])
  assert n == 5
  np.testing.assert_allclose(same, 1.0, atol=1e-6)
  sim, n = attention_similarity(m1, m2, [(np.arange(3), {k: v[:3] for k, v in batch.items()}),
                                         (np.arange(3, 5), {k: v[3:] for k, v in batch.items()})])
  a1 = np.asarray(m1(ids, mask, types, return_attentions=True)["attentions"])
  a2 = np.asarray(m2(ids, mask, types, return_attentions=True)["attentions"])
  want = np.asarray(measures.attention_cosine(a1, a2, mask)).mean(0)
  np.testing.assert_allclose(sim, want, atol=1e-5)
  assert sim.max() < 0.9999
  table = similarity_table(sim)
  assert list(table.columns) == ["layer", "head", "cosine"] and len(table) == 8


def test_measures_report_sections(tmp_path):
  from heads_jax.report import measures as measures_report
  from heads_jax.report.figures import clark
  from heads_jax.report.page import write_page
  att, mask, cls = _attention(seed=5, b=3, l=2, h=3)
  out = {k: np.asarray(v) for k, v in measures.all_measures(att, cls, mask, js=True).items()}
  np.savez(tmp_path / "measures.npz", entropy=out["entropy"], cls_entropy=out["cls_entropy"],
           token_attention=out["token_attention"], token_measures=np.array(measures.TOKEN_MEASURES),
           js=out["js"].mean(0), lengths=mask.sum(-1))
  sections = measures_report.measures_sections(tmp_path, tmp_path / "figures")
  assert [s["title"] for s in sections][-1] == "Heads by Jensen-Shannon distance"
  for name in ("measures_entropy.png", "measures_tokens.png", "measures_js_mds.png"):
    assert (tmp_path / "figures" / name).read_bytes().startswith(b"\x89PNG")
  page = write_page(tmp_path, title="t", sections=sections, settings={"a": 1})
  text = page.read_text()
  assert text.count("data:image/png;base64,") == 3 and "http" not in text.replace("http-equiv", "")
  xy = clark.mds_embedding(out["js"].mean(0))
  assert xy.shape == (6, 2)


@pytest.mark.slow
def test_analysis_step_and_collector_gather_measures(tmp_path):
  """measures=True, js=True: the same jitted pass returns the measures; the collector stores the
  per-sequence ones in dataset order (filler rows dropped) and averages js over the sequences;
  measures.npz round-trips; scores.npz keeps its contract."""
  from tests import reference_impl as ref
  from heads_jax import contract
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  cfg = config_for("tiny", vocab_size=2048, max_position_embeddings=32)
  model = BertModel(cfg, rngs=nnx.Rngs(1))
  data = ref.random_batch(np.random.default_rng(7), 7, 12, min_len=3)
  step = make_analysis_step(model, roles=("local", "cls"), measures=True, js=True)
  filler = B.empty_batch(1, 12)
  padded = {f: np.concatenate([v, filler[f]]) for f, v in data.items()}      # row 7: filler

  def batches():
    for idx in (np.array([4, 0, 7]), np.array([2, 6, 5]), np.array([1, 3, 7])):
      yield np.where(idx == 7, -1, idx), {f: v[idx] for f, v in padded.items()}
  got = collect(step, batches(), 7, progress=False)
  attn = model(data["input_ids"], data["attention_mask"], data["token_type_ids"],
               return_attentions=True)["attentions"]
  want = {k: np.asarray(v) for k, v in measures.all_measures(
      attn, data["token_class"], data["attention_mask"], js=True).items()}
  for key in ("entropy", "cls_entropy", "token_attention"):
    assert got[key].shape == want[key].shape
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5)
  assert got["js"].shape == (8, 8) and got["js_sequences"] == 7
  np.testing.assert_allclose(got["js"], want["js"].mean(0), rtol=1e-4, atol=1e-5)
  plain = make_analysis_step(model, roles=("local", "cls"))(data)
  assert sorted(plain) == ["distance", "sieve_bias"]                         # default: unchanged
  np.testing.assert_allclose(got["sieve_bias"], plain["sieve_bias"], rtol=1e-5, atol=1e-6)
  contract.write_scores(tmp_path, got["sieve_bias"], got["roles"], got["distance"], got["lengths"])
  with np.load(tmp_path / "scores.npz") as z:
    assert sorted(z.files) == ["distance", "lengths", "roles", "sieve_bias"]
  path = contract.write_measures(tmp_path, got)
  back = contract.read_measures(tmp_path)
  assert back["token_measures"] == measures.TOKEN_MEASURES
  np.testing.assert_allclose(back["entropy"], got["entropy"])
  np.testing.assert_allclose(back["js"], got["js"])
  np.testing.assert_array_equal(back["lengths"], data["attention_mask"].sum(-1))
  assert path.name == "measures.npz"
  no_js = collect(make_analysis_step(model, roles=("local",), measures=True), batches(), 7,
                  progress=False)
  assert "js" not in no_js and no_js["entropy"].shape == (7, 2, 4)
  with pytest.raises(KeyError, match="measures=True"):
    contract.write_measures(tmp_path / "m2.npz", plain | {"lengths": np.zeros(7)})


def test_combine_measures_and_analysis_sections(tmp_path):
  from heads_jax.report.measures import analysis_measures_sections
  from heads_jax import contract
  from heads_jax.stats.collector import combine_measures
  rng = np.random.default_rng(0)

  def part(n, js_value):
    return {"entropy": rng.random((n, 2, 3)), "cls_entropy": rng.random((n, 2, 3)),
            "token_attention": rng.random((n, 2, 3, 5)), "lengths": np.full(n, 7),
            "js": np.full((6, 6), js_value), "js_sequences": n}
  a, b = part(2, 1.0), part(6, 3.0)
  both = combine_measures([a, b])
  assert both["entropy"].shape == (8, 2, 3)
  np.testing.assert_array_equal(both["token_attention"][2:], b["token_attention"])
  np.testing.assert_allclose(both["js"], 2.5)          # weighted by the sequences: (2*1 + 6*3) / 8
  assert both["js_sequences"] == 8
  assert analysis_measures_sections(tmp_path) == []
  contract.write_measures(tmp_path, both)
  titles = [s["title"] for s in analysis_measures_sections(tmp_path)]
  assert titles == ["Attention entropy (Clark et al. 2019)", "Attention to special tokens and neighbours",
                    "Heads by Jensen-Shannon distance"]


def test_host_modules_import_no_jax():
  import subprocess
  import sys
  code = ("import sys; import heads_jax.report.measures, heads_jax.ablation.groups, "
          "heads_jax.stats.collector; assert 'jax' not in sys.modules, 'jax was imported'")
  subprocess.run([sys.executable, "-c", code], check=True)
