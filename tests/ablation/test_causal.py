"""The causal test of a role (heads_jax.ablation.causal): matched random groups, permutation
p-values, and mean ablation."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from heads_jax.ablation import ablate, evaluate
from heads_jax.ablation.causal import (GroupEvaluator, causal_tests, head_output_means,
                                       layer_counts, matched_random_group)
from heads_jax.ablation.groups import HeadGroup
from heads_jax.data import glue
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification
from tests.helpers import random_batch

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32, initializer_range=0.2)


def test_matched_random_groups_keep_the_layer_distribution():
  heads = ((1, 0), (1, 3), (3, 2))
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(200):
    g = matched_random_group(heads, 4, 6, rng)
    assert layer_counts(g.heads) == {1: 2, 3: 1} and len(set(g.heads)) == 3
    seen.update(g.heads)
  # every head of layers 1 and 3 is drawn, none of layers 0 and 2
  assert seen == {(l, h) for l in (1, 3) for h in range(6)}


class _Planted:
  """A fake evaluator: accuracy 0.9 minus 0.2 per planted head removed, 0.01 per other head."""
  num_layers, num_heads, mode = 4, 16, "remove"
  planted = {(1, 0), (1, 1), (2, 3)}

  def evaluate(self, heads):
    heads = set(heads)
    hit = len(heads & self.planted)
    return {"accuracy": 0.9 - 0.2 * hit - 0.01 * (len(heads) - hit), "f1": 0.0,
            "loss": 0.3 + 0.2 * hit}


def test_planted_role_beats_random_groups_of_the_same_layers():
  groups = [HeadGroup("planted", "role", tuple(sorted(_Planted.planted))),
            HeadGroup("other", "role", ((1, 5), (1, 6), (2, 7))),
            HeadGroup("empty", "role", ())]
  table = causal_tests(_Planted(), groups, random_groups=39, seed=1).set_index("group")
  assert table.loc["planted", "change"] == pytest.approx(-0.6)
  assert table.loc["planted", "rank"] == 1 and table.loc["planted", "p_value"] == pytest.approx(1 / 40)
  assert table.loc["planted", "layers"] == "1x2,2x1"
  # the other group has the same layer distribution: the same random groups, a large p-value
  assert table.loc["other", "random_mean_change"] == table.loc["planted", "random_mean_change"]
  assert table.loc["other", "p_value"] > 0.5
  assert np.isnan(table.loc["empty", "p_value"])
  loss = causal_tests(_Planted(), groups[:1], random_groups=39, metric="loss", seed=1)
  assert loss["p_value"].iloc[0] == pytest.approx(1 / 40)   # harm is loss up


def _planted_classifier(planted, seed=0):
  """A tiny classifier whose attention output projection is zero except on the planted heads:
  only they move information into [CLS]."""
  model = BertForSequenceClassification(CFG, num_labels=2, rngs=nnx.Rngs(seed))
  e = CFG.head_dim
  for l, layer in enumerate(model.bert.layers):
    k = np.asarray(layer.attention.output.kernel.value)
    keep = np.zeros_like(k)
    for (pl, ph) in planted:
      if pl == l:
        keep[ph * e:(ph + 1) * e] = k[ph * e:(ph + 1) * e]
    layer.attention.output.kernel.value = jnp.asarray(keep)
  return model


def _data(model, n=40, seed=0):
  rng = np.random.default_rng(seed)
  ids, mask, types = random_batch(rng, b=n, k=12, vocab=97)
  ids[:, 0] = 2                      # the same first token: [CLS] alone carries no input
  labels = np.asarray(model(ids, mask, types)["logits"]).argmax(-1).astype(np.int32)
  return evaluate.EvalData(ids, mask, types, labels, glue.task_info("sst2"), "own predictions")


@pytest.mark.slow
def test_planted_heads_carry_the_classifier_signal():
  planted = ((0, 1), (1, 2))
  model = _planted_classifier(planted, seed=3)
  data = _data(model)
  assert 0 < data.labels.mean() < 1          # the model's own labels: both classes
  ev = evaluate.Evaluator(model, data, batch_size=64)
  groups = [HeadGroup("planted", "role", planted)]
  table = causal_tests(GroupEvaluator(ev, "remove"), groups, random_groups=7, seed=0)
  row = table.iloc[0]
  assert row["base"] == 1.0 and row["change"] < -0.05
  assert row["rank"] == 1 and row["p_value"] == pytest.approx(1 / 8)
  # a random group of the same layers (one head of each layer) hits a planted head only by chance
  assert row["random_mean_change"] > row["change"]


@pytest.mark.slow
def test_mean_ablation_keeps_a_constant_head_and_differs_from_removal():
  """Head (0, 1) with a zero value kernel has the constant context b_V: its mean is b_V, and
  replacing it by its mean changes nothing, while removing it does."""
  model = BertForSequenceClassification(CFG, num_labels=2, rngs=nnx.Rngs(1))
  e = CFG.head_dim
  value = model.bert.layers[0].attention.value
  k = np.asarray(value.kernel.value).copy()
  k[:, e:2 * e] = 0.0
  value.kernel.value = jnp.asarray(k)
  value.bias.value = value.bias.value + 0.5
  data = _data(model, n=24, seed=2)
  ev = evaluate.Evaluator(model, data, batch_size=8)
  means = head_output_means(ev)
  np.testing.assert_allclose(means[0, 1], np.asarray(value.bias.value)[e:2 * e], rtol=1e-5, atol=1e-6)
  base = ev.evaluate()
  group = GroupEvaluator(ev, "mean", means)
  assert group.evaluate(((0, 1),))["loss"] == pytest.approx(base["loss"], abs=1e-5)
  gate = np.ones((CFG.num_layers, CFG.num_heads), np.float32)
  gate[0, 1] = 0.0
  shifted = nnx.merge(ev.graphdef, group.mean_state(((0, 1),)))
  logits = np.asarray(model(data.input_ids, data.attention_mask, data.token_type_ids)["logits"])
  mean_logits = shifted(data.input_ids, data.attention_mask, data.token_type_ids, head_gate=gate)
  removed = model(data.input_ids, data.attention_mask, data.token_type_ids, head_gate=gate)
  np.testing.assert_allclose(np.asarray(mean_logits["logits"]), logits, atol=1e-5)
  assert np.abs(np.asarray(removed["logits"]) - logits).max() > 1e-3
  # ablate_groups takes the mean mode too
  table = ablate.ablate_groups(ev, [HeadGroup("constant", "heads", ((0, 1),))], mode="mean",
                               random_seeds=0, base=base)
  assert table["ablation"].iloc[1] == "mean"
  assert table["loss_change"].iloc[1] == pytest.approx(0.0, abs=1e-5)
  # the evaluator's own state is back after a mean ablation
  assert ev.evaluate()["loss"] == pytest.approx(base["loss"], abs=1e-7)


def test_mean_ablation_refuses_a_model_without_an_output_bias():
  """ModernBERT's attention output has no bias (as transformers'): --mode mean, which shifts that
  bias, is refused in one line before any work, naming the modes that do run."""
  import types
  from heads_jax.errors import UserError
  from heads_jax.model.modernbert import ModernBertConfig, ModernBertForSequenceClassification
  cfg = ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2,
                         intermediate_size=48, max_position_embeddings=64)
  graphdef, state = nnx.split(ModernBertForSequenceClassification(cfg, rngs=nnx.Rngs(0)))
  fake = types.SimpleNamespace(graphdef=graphdef, state=state, num_layers=3, num_heads=2)
  with pytest.raises(UserError, match=r"no bias \(ModernBERT\); use --mode remove or uniform$"):
    GroupEvaluator(fake, mode="mean")
