"""The one attention module's hook object (heads_jax/model/attention.py) on every family: the
two intervention points act as the gates they generalise, and the keywords and ``hooks=`` are
one way of asking."""

import numpy as np
import pytest

import jax.numpy as jnp
from flax import nnx

from heads_jax.model.attention import AttentionHooks
from heads_jax.model.bert import BertModel
from heads_jax.model.config import config_for
from heads_jax.model.deberta import DebertaConfig, DebertaModel
from heads_jax.model.modernbert import ModernBertConfig, ModernBertModel
from tests.helpers import random_batch

SIZES = dict(vocab_size=61, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
             max_position_embeddings=32)
FAMILIES = {
    "bert": lambda: BertModel(config_for("tiny", **SIZES), rngs=nnx.Rngs(0)),
    # a window of +-2 over 11 positions: layers 1 and 2 are local
    "modernbert": lambda: ModernBertModel(ModernBertConfig(**SIZES, local_attention=4,
                                                           global_every=3), rngs=nnx.Rngs(0)),
    "deberta": lambda: DebertaModel(DebertaConfig(**SIZES, position_buckets=8,
                                                  max_relative_positions=32), rngs=nnx.Rngs(0)),
}


@pytest.fixture(scope="module")
def batch():
  ids, mask, types = random_batch(np.random.default_rng(2), b=3, k=11, vocab=61)
  return ids, mask, types


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_edits_act_as_the_gates_they_generalise(family, batch):
  """``edit_probs`` scaling a head's probabilities by g, and ``edit_context`` scaling its
  context by g, both equal the ``"remove"`` gate g (the context is linear in the
  probabilities); the identity edit changes nothing; ``edit_context`` runs on the fused path."""
  ids, mask, types = batch
  model = FAMILIES[family]()
  gate = np.ones((3, 2), np.float32)
  gate[1, 0], gate[2, 1] = 0.0, 0.25
  g = jnp.asarray(gate)
  ref = model(ids, mask, types, head_gate=gate, attention="explicit")["last_hidden_state"]
  seen = []

  def scale_probs(layer, probs):
    seen.append((layer, probs.shape))
    return probs * g[layer][None, :, None, None]

  by_probs = model(ids, mask, types, hooks=AttentionHooks(edit_probs=scale_probs))
  assert [s[0] for s in seen] == [0, 1, 2] and seen[0][1] == (3, 2, 11, 11)
  np.testing.assert_allclose(by_probs["last_hidden_state"], ref, atol=2e-5)
  scale_ctx = lambda layer, ctx: ctx * g[layer][None, None, :, None].astype(ctx.dtype)  # noqa: E731
  real = mask > 0  # a padding query of a local layer may see no key: 0 explicit, the mean fused
  for path in ("explicit", "xla"):
    by_ctx = model(ids, mask, types, hooks=AttentionHooks(path=path, edit_context=scale_ctx))
    np.testing.assert_allclose(np.asarray(by_ctx["last_hidden_state"])[real],
                               np.asarray(ref)[real], atol=2e-5)
  same = model(ids, mask, types, return_attentions=True,
               hooks=AttentionHooks(edit_probs=lambda layer, p: p))
  base = model(ids, mask, types, return_attentions=True)
  np.testing.assert_array_equal(same["attentions"], base["attentions"])
  np.testing.assert_array_equal(same["last_hidden_state"], base["last_hidden_state"])


def test_hooks_and_keywords_are_one_way_of_asking(batch):
  ids, mask, types = batch
  model = FAMILIES["bert"]()
  gate = np.ones((3, 2), np.float32)
  gate[0, 1] = 0.0
  a = model(ids, mask, types, head_gate=gate, gate_mode="uniform", return_attentions=True)
  b = model(ids, mask, types, hooks=AttentionHooks(gate=gate, gate_mode="uniform"),
            return_attentions=True)
  np.testing.assert_array_equal(a["attentions"], b["attentions"])
  with pytest.raises(ValueError, match="head_gate inside hooks="):
    model(ids, mask, types, head_gate=gate, hooks=AttentionHooks())
  with pytest.raises(ValueError, match="cannot return or edit"):
    model(ids, mask, types, hooks=AttentionHooks(path="xla", edit_probs=lambda layer, p: p))
  with pytest.raises(ValueError, match="gate_mode must be one of"):
    AttentionHooks(gate_mode="zero")
