"""Head ablation: gates, intra/inter removal, the evaluator, importance and pruning."""

import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx
from scipy.special import erf

from heads_jax.ablation import ablate, evaluate, groups, importance, pruning
from heads_jax.ablation.causal import matched_random_groups
from heads_jax.data import glue
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification
from tests.helpers import random_batch

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32, initializer_range=0.2)
L, H = CFG.num_layers, CFG.num_heads


def _classifier(seed=0):
  return BertForSequenceClassification(CFG, num_labels=2, rngs=nnx.Rngs(seed))


def _eval_data(n=20, k=14, seed=0, task="mrpc") -> evaluate.EvalData:
  rng = np.random.default_rng(seed)
  ids, mask, types = random_batch(rng, b=n, k=k, vocab=97)
  labels = rng.integers(0, 2, size=n).astype(np.int32)
  return evaluate.EvalData(ids, mask, types, labels, glue.task_info(task), "random")


@pytest.fixture(scope="module")
def model():
  return _classifier(0)


@pytest.fixture(scope="module")
def data():
  return _eval_data()


@pytest.fixture(scope="module")
def ev(model, data):
  return evaluate.Evaluator(model, data, batch_size=8)


def _plain_metrics(model, data, **kw):
  """Reference: one un-jitted forward of the whole set in its original order and padding (no
  length sorting, bucketing, filler rows or mesh), metrics in numpy."""
  out = model(data.input_ids, data.attention_mask, data.token_type_ids, **kw)
  logits = np.asarray(out["logits"], np.float64)
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  preds, y = logits.argmax(-1), data.labels
  nll = -logp[np.arange(len(y)), y]
  tp, fp, fn = [np.sum((preds == a) & (y == b)) for a, b in ((1, 1), (1, 0), (0, 1))]
  f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
  return {"accuracy": np.mean(preds == y), "f1": f1, "loss": np.mean(nll)}


# ---------------------------------------------------------------------------------------------
# the model's gates and segment removal


@pytest.mark.slow
def test_removing_a_layer_equals_zeroed_attention_output():
  """Gate 0 on every head of layer 1 == that layer's attention adding only the output bias
  (zeroed output kernel; and, separately, zeroed value kernel and bias)."""
  ids, mask, types = random_batch(np.random.default_rng(3), b=4, k=10, vocab=97)
  m = _classifier(1)
  gate = groups.gate_for(groups.layer_groups(L, H)[1].heads, L, H)
  gated = m(ids, mask, types, head_gate=gate)
  for zero in (("output",), ("value",)):
    z = _classifier(1)
    att = z.bert.layers[1].attention
    for name in zero:
      lin = getattr(att, name)
      lin.kernel.value = jnp.zeros_like(lin.kernel.value)
      if name == "value":
        lin.bias.value = jnp.zeros_like(lin.bias.value)
    ref = z(ids, mask, types)
    np.testing.assert_allclose(gated["logits"], ref["logits"], atol=1e-5)
    np.testing.assert_allclose(gated["last_hidden_state"], ref["last_hidden_state"], atol=1e-5)
  # and the gate really changed something
  assert np.abs(np.asarray(gated["logits"]) - np.asarray(m(ids, mask, types)["logits"])).max() > 1e-4


def test_uniform_group_equals_formula():
  ids, mask, types = random_batch(np.random.default_rng(4), b=3, k=9, vocab=97)
  m = _classifier(2)
  heads = ((0, 1), (1, 3))
  att = np.asarray(m(ids, mask, types, head_gate=groups.gate_for(heads, L, H), gate_mode="uniform",
                     return_attentions=True)["attentions"])
  n = mask.sum(-1)
  expected = mask[:, None, :] * mask[:, :, None] / n[:, None, None]
  for l, h in heads:
    np.testing.assert_allclose(att[:, l, h], expected, atol=1e-7)
  assert not np.allclose(att[:, 0, 0], expected, atol=1e-3)


def _layer0_reference(m, hidden0, mask, types, keep_fn):
  """Independent numpy forward of layer 0 with the attention rows transformed by ``keep_fn``."""
  a = m.bert.layers[0].attention
  p = lambda lin: (np.asarray(lin.kernel.value, np.float64), np.asarray(lin.bias.value, np.float64))
  x = np.asarray(hidden0, np.float64)
  b, q, d = x.shape
  e = d // H
  split = lambda y: y.reshape(b, q, H, e).transpose(0, 2, 1, 3)
  (wq, bq), (wk, bk), (wv, bv), (wo, bo) = p(a.query), p(a.key), p(a.value), p(a.output)
  s = split(x @ wq + bq) @ split(x @ wk + bk).transpose(0, 1, 3, 2) / np.sqrt(e)
  s = np.where(mask[:, None, None, :] > 0, s, -1e30)
  probs = np.exp(s - s.max(-1, keepdims=True))
  probs = probs / probs.sum(-1, keepdims=True) * (mask[:, None, None, :] > 0)
  probs = keep_fn(probs)
  ctx = (probs @ split(x @ wv + bv)).transpose(0, 2, 1, 3).reshape(b, q, d)

  def ln(y, norm):
    mu, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    return ((y - mu) / np.sqrt(var + CFG.layer_norm_eps) * np.asarray(norm.scale.value)
            + np.asarray(norm.bias.value))

  y = ln(ctx @ wo + bo + x, a.norm)
  layer = m.bert.layers[0]
  (wi, bi), (wo2, bo2) = p(layer.intermediate), p(layer.output)
  hmid = y @ wi + bi
  hmid = 0.5 * hmid * (1 + erf(hmid / np.sqrt(2)))
  return probs, ln(hmid @ wo2 + bo2 + y, layer.norm)


@pytest.mark.slow
@pytest.mark.parametrize("renormalise", [False, True])
@pytest.mark.parametrize("part", ["intra", "inter"])
def test_segment_removal_equals_hand_masked_attention(part, renormalise):
  """A pair [CLS] a a [SEP] b b b [SEP] (+ padding): the intra (inter) attention of the chosen
  heads of layer 0 is zeroed by hand; the layer's attention and output match."""
  m = _classifier(5)
  ids = np.array([[2, 11, 12, 3, 21, 22, 23, 3, 0, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  types = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0]], np.int32)
  heads = ((0, 1), (0, 2), (1, 0))
  removal = groups.segment_removal_for(heads, L, H, part)
  out = m.bert(ids, mask, types, segment_removal=removal, renormalise_segments=renormalise,
               return_attentions=True, return_hidden_states=True)
  same = types[0][:, None] == types[0][None, :]
  drop = same if part == "intra" else ~same

  def keep_fn(probs):
    probs = probs.copy()
    for h in (1, 2):
      probs[0, h][drop] = 0.0
      if renormalise:
        probs[0, h] /= np.maximum(probs[0, h].sum(-1, keepdims=True), 1e-30)
    return probs * mask[:, None, :, None]

  ref_probs, ref_hidden = _layer0_reference(m, out["hidden_states"][0], mask, types, keep_fn)
  np.testing.assert_allclose(out["attentions"][:, 0], ref_probs, atol=1e-6)
  real = mask[0] > 0  # padding positions' hidden states are not defined by the reference
  np.testing.assert_allclose(out["hidden_states"][1][:, real], ref_hidden[:, real], atol=2e-5)
  rows = np.asarray(out["attentions"][0, 0, 1, :8]).sum(-1)
  if renormalise:
    np.testing.assert_allclose(rows, 1.0, atol=1e-6)
  else:
    assert rows.max() < 1 - 1e-3  # mass removed, not put back
  # a zero removal is the identity
  plain = m.bert(ids, mask, types)["last_hidden_state"]
  zero = m.bert(ids, mask, types, segment_removal=np.zeros((L, H, 2)))["last_hidden_state"]
  np.testing.assert_allclose(zero, plain, atol=1e-6)


def test_segment_removal_shape_is_checked(model):
  ids, mask, types = random_batch(np.random.default_rng(0), b=1, k=5, vocab=97)
  with pytest.raises(ValueError, match="segment_removal must have shape"):
    model(ids, mask, types, segment_removal=np.zeros((L, H)))


# ---------------------------------------------------------------------------------------------
# the evaluator


@pytest.mark.slow
def test_evaluator_equals_plain_forward(model, data, ev):
  base = ev.evaluate()
  ref = _plain_metrics(model, data)
  assert base["n"] == len(data)
  for key in ("accuracy", "f1"):
    assert base[key] == pytest.approx(ref[key])
  assert base["loss"] == pytest.approx(ref["loss"], abs=1e-5)
  gate = groups.gate_for(((0, 0), (1, 2)), L, H)
  removal = groups.segment_removal_for(((0, 3),), L, H, "intra")
  for kw, ref_kw in (
      ({"head_gate": gate, "gate_mode": "uniform"}, {"head_gate": gate, "gate_mode": "uniform"}),
      ({"segment_removal": removal}, {"segment_removal": removal}),
      ({"segment_removal": removal, "renormalise": True},
       {"segment_removal": removal, "renormalise_segments": True})):
    got, want = ev.evaluate(**kw), _plain_metrics(model, data, **ref_kw)
    assert got["accuracy"] == pytest.approx(want["accuracy"])
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    assert got["loss"] != pytest.approx(base["loss"], abs=1e-6)


def test_evaluator_rejects_wrong_model_or_data(model):
  from heads_jax.errors import UserError
  from heads_jax.model.bert import BertModel
  with pytest.raises(UserError, match="not a fine-tuned classifier"):
    evaluate.Evaluator(BertModel(CFG, rngs=nnx.Rngs(0)), _eval_data(4))
  three = BertForSequenceClassification(CFG, num_labels=3, rngs=nnx.Rngs(0))
  with pytest.raises(UserError, match="3 labels"):
    evaluate.Evaluator(three, _eval_data(4))


def test_make_batches_cover_every_row_once(data):
  batches = evaluate.make_batches(data, batch_size=6, multiple=4, bucket_step=4)
  rows = np.concatenate([r for _, r in batches])
  assert sorted(rows[rows >= 0].tolist()) == list(range(len(data)))
  for b, r in batches:
    assert len(r) == 8
    assert b["input_ids"].shape[1] % 4 == 0 or b["input_ids"].shape[1] == 14
    assert np.all(b["attention_mask"][r < 0] == 0) and np.all(b["weights"][r < 0] == 0)
    real = r >= 0
    assert b["attention_mask"][real].sum() == data.attention_mask[r[real]].sum()  # nothing cut


# ---------------------------------------------------------------------------------------------
# importance


def _per_example_losses(model, data):
  graphdef, state = nnx.split(model)

  @jax.jit
  def losses(gate):
    out = nnx.merge(graphdef, state)(data.input_ids, data.attention_mask, data.token_type_ids,
                                     head_gate=gate)
    logp = jax.nn.log_softmax(out["logits"])
    return -jnp.take_along_axis(logp, jnp.asarray(data.labels)[:, None], axis=1)[:, 0]
  return losses


@pytest.mark.slow
def test_importance_matches_finite_differences(model, data, ev):
  losses = _per_example_losses(model, data)
  eps = 1e-2
  fd = np.zeros((len(data), L, H))
  for l in range(L):
    for h in range(H):
      up, down = np.ones((L, H), np.float32), np.ones((L, H), np.float32)
      up[l, h] += eps
      down[l, h] -= eps
      fd[:, l, h] = (np.asarray(losses(up), np.float64) - np.asarray(losses(down), np.float64)) / (2 * eps)
  per_example = importance.head_importance(ev)
  np.testing.assert_allclose(per_example, np.abs(fd).mean(0), rtol=2e-2, atol=2e-4)
  assert per_example.max() > 1e-3
  # per batch (authors' code): |gradient of each batch's mean loss|, averaged over batches
  batch = importance.head_importance(ev, per_example=False)
  ref = np.mean([np.abs(fd[r[r >= 0]].mean(0)) for r in ev.rows], axis=0)
  np.testing.assert_allclose(batch, ref, rtol=2e-2, atol=2e-4)
  # per-layer L2 normalisation
  norm = importance.head_importance(ev, normalize_layers=True)
  np.testing.assert_allclose(np.linalg.norm(norm, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(norm, per_example / np.linalg.norm(per_example, axis=1, keepdims=True),
                             rtol=1e-5)


@pytest.mark.slow
def test_importance_of_a_removed_head_gradient_at_gate(model, data, ev):
  """At a gate with some heads at 0, the importance is the gradient there (finite differences)."""
  losses = _per_example_losses(model, data)
  gate = groups.gate_for(((0, 0), (1, 1)), L, H)
  up, down = gate.copy(), gate.copy()
  up[0, 0], down[0, 0] = 0.01, -0.01
  fd = np.abs((np.asarray(losses(up)) - np.asarray(losses(down))) / 0.02).mean()
  got = importance.ImportanceEstimator(ev)(gate)
  assert got[0, 0] == pytest.approx(fd, rel=2e-2, abs=2e-4)


# ---------------------------------------------------------------------------------------------
# pruning and ablation tables


def test_pruning_counts():
  assert pruning.pruning_counts(8, 0.25) == [0, 2, 4, 6, 8]
  assert pruning.pruning_counts(144, 0.1)[:3] == [0, 14, 29]
  assert pruning.pruning_counts(144, 0.05, 0.5)[-1] == 72
  with pytest.raises(Exception, match="share"):
    pruning.pruning_counts(8, 0.0)


def test_pruning_curve(ev):
  est = importance.ImportanceEstimator(ev)
  base = ev.evaluate()
  once = pruning.pruning_curve(ev, est, step=0.25, reestimate=False, random_seeds=2)
  first = once[(once["method"] == "importance") & (once["step"] == 0)].iloc[0]
  assert first["num_pruned"] == 0 and first["accuracy"] == base["accuracy"]
  assert first["loss"] == pytest.approx(base["loss"])
  order = pruning.importance_order(est(), np.zeros((L, H), bool))
  imp_rows = once[once["method"] == "importance"].sort_values("step")
  for _, row in imp_rows.iterrows():
    pruned = groups.parse_heads(row["pruned"]) if row["pruned"] else ()
    assert set(pruned) == set(order[:row["num_pruned"]])
  last = imp_rows.iloc[-1]
  assert last["share_pruned"] == 1.0
  assert last["loss"] == pytest.approx(ev.evaluate(np.zeros((L, H)))["loss"], abs=1e-6)
  step2 = imp_rows[imp_rows["step"] == 2].iloc[0]
  gate = groups.gate_for(groups.parse_heads(step2["pruned"]), L, H)
  assert step2["loss"] == pytest.approx(ev.evaluate(gate)["loss"], abs=1e-6)
  rnd = once[once["method"] == "random"]
  assert sorted(rnd["seed"].unique()) == [0, 1]
  for _, g in rnd.groupby("seed"):   # nested sets along a random curve
    sets = [set(p.split(",")) - {""} for p in g.sort_values("step")["pruned"]]
    assert all(a <= b for a, b in zip(sets, sets[1:]))
  # re-estimation: each step's new heads are the least important under the current gate
  again = pruning.pruning_curve(ev, est, step=0.25, reestimate=True, random_seeds=0)
  rows = again.sort_values("step")
  prev = set()
  for _, row in rows.iterrows():
    cur = set(groups.parse_heads(row["pruned"])) if row["pruned"] else set()
    if cur - prev:
      mask = np.zeros((L, H), bool)
      for l, h in prev:
        mask[l, h] = True
      imp = est((~mask).astype(np.float32))
      want = pruning.importance_order(imp, mask)[:len(cur - prev)]
      assert cur - prev == set(want)
    prev = cur
  summary = pruning.curve_summary(once)
  assert summary.loc[0, "accuracy_importance"] == base["accuracy"]
  assert summary.loc[0, "accuracy_random"] == base["accuracy"]


def test_ablate_groups_table(ev):
  base = ev.evaluate()
  gs = groups.layer_groups(L, H) + [groups.HeadGroup("none", "heads", ())]
  table = ablate.ablate_groups(ev, gs, mode="remove", random_seeds=2, seed=3)
  assert table.iloc[0]["kind"] == "baseline" and table.iloc[0]["accuracy_change"] == 0
  row = table[table["group"] == "layer 1"].iloc[0]
  want = ev.evaluate(groups.gate_for(gs[1].heads, L, H))
  assert row["num_heads"] == H and row["loss"] == pytest.approx(want["loss"])
  assert row["loss_change"] == pytest.approx(want["loss"] - base["loss"])
  # a whole layer: no other group of its layers, so no random baseline (empty, not the group)
  assert np.isnan(row["random_loss"]) and np.isnan(row["random_loss_change"])
  assert row["random_seeds"] == 0
  # a group in part of its layers: the mean over the seeds' random groups of those layers
  part = groups.HeadGroup("part", "heads", ((0, 1), (1, 0), (1, 2)))
  row = ablate.ablate_groups(ev, [part], random_seeds=2, seed=3, base=base).iloc[1]
  rand = [ev.evaluate(groups.gate_for(g.heads, L, H))["loss"]
          for g in matched_random_groups(part.heads, L, H, 2, 3)]
  assert row["random_loss"] == pytest.approx(np.mean(rand)) and row["random_seeds"] == 2
  assert row["random_loss_change"] == pytest.approx(np.mean(rand) - base["loss"])
  empty = table[table["group"] == "none"].iloc[0]
  assert empty["num_heads"] == 0 and empty["loss_change"] == 0
  uniform = ablate.ablate_groups(ev, gs[:1], mode="uniform", random_seeds=0)
  want = ev.evaluate(groups.gate_for(gs[0].heads, L, H), gate_mode="uniform")
  assert uniform.iloc[1]["loss"] == pytest.approx(want["loss"])


def test_ablate_segments_table(ev):
  g = groups.HeadGroup("x", "heads", ((0, 1), (1, 2)))
  table = ablate.ablate_segments(ev, [g], parts=("intra", "inter"), renormalise=True,
                                 random_seeds=1)
  assert list(table["ablation"]) == ["none", "intra", "inter"]
  assert table["renormalised"].all()
  want = ev.evaluate(segment_removal=groups.segment_removal_for(g.heads, L, H, "inter"),
                     renormalise=True)
  assert table.iloc[2]["loss"] == pytest.approx(want["loss"])


def test_eval_rows_from_finetune_data_json(tmp_path):
  tok = load_tokenizer(None)
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_idx": [5, 1, 3]}))
  rows = evaluate.eval_rows_from_finetune(tmp_path)
  data = evaluate.load_eval_data("mrpc", tok, rows=rows)
  assert len(data) == 3 and data.rows.tolist() == [1, 3, 5]
  everything = evaluate.load_eval_data("mrpc", tok, max_examples=6)
  np.testing.assert_array_equal(data.labels, everything.labels[[1, 3, 5]])
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_idx": [100000]}))
  with pytest.raises(UserError, match="not in"):
    evaluate.load_eval_data("mrpc", tok, rows=evaluate.eval_rows_from_finetune(tmp_path))
  (tmp_path / "data.json").write_text(json.dumps({"task": "mrpc", "eval_split": "dev"}))
  assert evaluate.eval_rows_from_finetune(tmp_path / "data.json") is None
