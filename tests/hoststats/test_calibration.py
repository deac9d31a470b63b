"""The calibrated role rule (DESIGN.md section 3, heads_jax.hoststats.calibration): null heads get
no role, planted heads keep theirs, the numbers against hand-derived values and scipy."""

import jax
import numpy as np
import pandas as pd
import pytest
import scipy.stats

from heads_jax import contract
from heads_jax.data import vocabulary as B
from heads_jax.hoststats import calibration as cal
from heads_jax.hoststats.hypothesis import hypothesis_tests
from heads_jax.hoststats.roles import assignment_array
from heads_jax.sieves import build_sieves
from heads_jax.stats.measures import attention_entropy
from heads_jax.stats.sieve_bias import sieve_bias
from tests import reference_impl as ref


@jax.jit
def _scores(attn, batch):
  sb = sieve_bias(attn, build_sieves(batch, B.ROLES), batch["attention_mask"], B.ROLES)
  return sb, attention_entropy(attn, batch["attention_mask"])


def _uniform_rows(mask):
  m = mask.astype(np.float32)
  return m / m.sum(-1, keepdims=True)                          # [b, k]


def _heads(batch, kinds):
  """float32 ``[b, 1, h, q, k]``, one head per kind: "uniform" (1/n over the real keys), "prev"
  (all mass on t-1; t=0 on itself), "cls" (all mass on [CLS]), "block" (uniform over the
  non-special keys of the query's own segment; uniform where that set is empty)."""
  mask = batch["attention_mask"].astype(bool)
  b, k = mask.shape
  attn = np.zeros((b, 1, len(kinds), k, k), np.float32)
  for i in range(b):
    n = int(mask[i].sum())
    tt, tc = batch["token_type_ids"][i], batch["token_class"][i]
    for j, kind in enumerate(kinds):
      for t in range(n):
        if kind == "uniform":
          attn[i, 0, j, t, :n] = 1.0 / n
        elif kind == "prev":
          attn[i, 0, j, t, max(t - 1, 0)] = 1.0
        elif kind == "cls":
          attn[i, 0, j, t, 0] = 1.0
        elif kind == "block":
          own = [s for s in range(n) if tt[s] == tt[t] and tc[s] not in (B.TOKEN_CLS, B.TOKEN_SEP)]
          own = own or list(range(n))
          attn[i, 0, j, t, own] = 1.0 / len(own)
  return attn


def _decide(sb, entropy, lengths, *, rule="calibrated", use_entropy=True, **kw):
  tests, settings = hypothesis_tests(sb, B.ROLES, **kw)
  tests, settings = cal.apply_rule(tests, settings, sb, B.ROLES, lengths, rule=rule,
                                   entropy=entropy if use_entropy else None)
  assigned, _ = assignment_array(tests, B.ROLES, sb.shape[1], sb.shape[2])
  return tests, settings, assigned


def _batch(pairs: bool, seed: int, b: int = 40, k: int = 48):
  """MRPC-like lengths: 24..48 wordpieces (ln n > 3 = tau)."""
  return ref.random_batch(np.random.default_rng(seed), b, k, min_len=24,
                          pair_prob=1.0 if pairs else 0.0, rel_prob=0.8)


def _roles_of(assigned, h):
  return {B.ROLES[r] for r in np.flatnonzero(assigned[0, h])}


def test_uniform_values_by_hand():
  u = cal.uniform_values([5, 40], ("local", "block", "block_plain", "cls"))
  np.testing.assert_allclose(u, [[1, np.log(5), 1, 1], [1, np.log(40), 1, 1]])
  with pytest.raises(ValueError, match="lengths"):
    cal.uniform_values([0, 3], ("block",))


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("use_entropy", [True, False])
def test_uniform_heads_get_no_role_under_the_calibrated_rule(pairs, use_entropy):
  """Uniform attention scores exactly 1 (ln n on block): the paper's rule calls it a block head
  on pairs (ln n > 3), the calibrated rule gives it nothing, with or without the entropy."""
  batch = _batch(pairs, seed=1)
  attn = _heads(batch, ["uniform", "uniform"])
  sb, ent = (np.asarray(x) for x in _scores(attn, batch))
  lengths = batch["attention_mask"].sum(-1)
  tests, settings, assigned = _decide(sb, ent, lengths, use_entropy=use_entropy)
  assert not assigned.any()
  assert settings["rule"] == "calibrated"
  paper = tests["assigned_paper"].to_numpy(bool).reshape(assigned.shape)
  if pairs:
    assert (np.log(lengths) > 3).all()  # the artefact needs n > e^3 = 20.1
    assert paper[..., B.ROLES.index("block")].all()
    assert not np.delete(paper, B.ROLES.index("block"), axis=-1).any()
  else:
    assert not paper.any()
  if use_entropy:  # rows exactly uniform: divergence 0 < 0.1 nats
    assert settings["num_near_uniform_heads"] == 2
    assert tests["near_uniform"].all()
  else:
    assert settings["near_uniform_computed"] is False and not tests["near_uniform"].any()


@pytest.mark.parametrize("pairs", [False, True])
def test_planted_heads_keep_their_roles_beside_uniform_ones(pairs):
  batch = _batch(pairs, seed=2)
  kinds = ["uniform", "prev", "cls", "block"]
  attn = _heads(batch, kinds)
  sb, ent = (np.asarray(x) for x in _scores(attn, batch))
  lengths = batch["attention_mask"].sum(-1)
  tests, settings, assigned = _decide(sb, ent, lengths)
  assert _roles_of(assigned, 0) == set()
  assert {"prev_local", "local"} <= _roles_of(assigned, 1)
  assert {"cls", "delimiter"} <= _roles_of(assigned, 2)
  assert ("block" in _roles_of(assigned, 3)) == pairs
  # on single sentences the "block" head is uniform over all but [CLS] and [SEP]: near-uniform
  # (divergence ln(n / (n - 2)) < 0.1 nats for n >= 24)
  assert settings["near_uniform_heads"] == (["0:0"] if pairs else ["0:0", "0:3"])
  if pairs:
    # the planted block head by hand: per query t with own set S_t, beta(t) = n / |S_t| and the
    # row entropy ln |S_t|, so block - ln n = mean_t(n / |S_t| ln |S_t|) - ln n per sequence.
    want = []
    for i in range(len(lengths)):
      n = int(lengths[i])
      tt, tc = batch["token_type_ids"][i], batch["token_class"][i]
      vals = []
      for t in range(n):
        m = sum(1 for s in range(n) if tt[s] == tt[t] and tc[s] not in (B.TOKEN_CLS, B.TOKEN_SEP))
        vals.append(n / m * np.log(m))
      want.append(np.mean(vals) - np.log(n))
    row = tests[(tests["head"] == 3) & (tests["role"] == "block")].iloc[0]
    np.testing.assert_allclose(row["mean_minus_uniform"], np.mean(want), rtol=1e-5)


def test_calibrated_p_value_is_the_intersection_union_of_scipy_tests():
  """p_calibrated = max(p_tau, p_uniform, p_block_plain), each one-sided scipy t-test; the
  correction is applied to p_calibrated; a head between tau and ln n is a paper block head only."""
  rng = np.random.default_rng(3)
  b = 30
  lengths = rng.integers(40, 80, b)
  roles = ("local", "block", "block_plain")
  x = np.empty((b, 1, 3, 3))
  x[:, 0, :, 0] = rng.normal(3.6, 0.3, (b, 3))                              # local, above tau
  x[:, 0, 0, 1] = np.log(lengths) + rng.normal(0.5, 0.2, b)                 # block above ln n
  x[:, 0, 1, 1] = np.log(lengths) - 0.4 + rng.normal(0, 0.1, b)             # tau < block < ln n
  x[:, 0, 2, 1] = np.log(lengths) + rng.normal(0.5, 0.2, b)                 # above ln n, but ...
  x[:, 0, :2, 2] = rng.normal(1.4, 0.1, (b, 2))
  x[:, 0, 2, 2] = rng.normal(0.95, 0.05, b)                                 # ... block_plain < 1
  tests, settings = hypothesis_tests(x, roles, correction="holm")
  out, settings = cal.apply_rule(tests, settings, x, roles, lengths)
  assert tuple(out.columns) == contract.TEST_COLUMNS + contract.RULE_COLUMNS
  blocks = out[out["role"] == "block"].reset_index(drop=True)
  for h in range(3):
    xb = x[:, 0, h, 1]
    p_tau = scipy.stats.ttest_1samp(xb, 3.0, alternative="greater").pvalue
    p_uni = scipy.stats.ttest_1samp(xb - np.log(lengths) - cal.TOLERANCE, 0,
                                    alternative="greater").pvalue
    p_plain = scipy.stats.ttest_1samp(x[:, 0, h, 2] - 1 - cal.TOLERANCE, 0,
                                      alternative="greater").pvalue
    row = blocks.iloc[h]
    np.testing.assert_allclose([row["p_value"], row["p_uniform"], row["p_block_plain"]],
                               [p_tau, p_uni, p_plain], rtol=1e-6, atol=1e-300)
    np.testing.assert_allclose(row["p_calibrated"], max(p_tau, p_uni, p_plain), rtol=1e-6)
    np.testing.assert_allclose(row["uniform"], np.log(lengths).mean())
  m = out["p_calibrated"].notna().sum()
  order = np.sort(out["p_calibrated"].dropna().to_numpy())
  holm = np.minimum(np.maximum.accumulate(order * (m - np.arange(m))), 1)
  np.testing.assert_allclose(np.sort(out["p_calibrated_adjusted"].dropna()), np.sort(holm))
  assert list(blocks["assigned_paper"]) == [True, True, True]
  assert list(blocks["assigned_calibrated"]) == [True, False, False]
  assert (out["assigned"] == out["assigned_calibrated"]).all()
  # bare roles: uniform value 1, below tau, so the rules agree there
  local = out[out["role"] == "local"]
  assert (local["assigned_paper"] == local["assigned_calibrated"]).all()
  paper, _ = cal.apply_rule(tests, settings, x, roles, lengths, rule="paper")
  assert (paper["assigned"] == paper["assigned_paper"]).all()


def test_block_plain_at_most_one_is_never_block():
  """Whatever the block scores, a head whose mean block_plain is <= 1 gets no block role: test
  C's statistic is then at most -delta / se < 0."""
  rng = np.random.default_rng(4)
  b, h = 25, 50
  lengths = rng.integers(20, 120, b)
  x = np.empty((b, 1, h, 2))
  x[..., 0] = np.log(lengths)[:, None, None] + rng.normal(1.0, 0.5, (b, 1, h))
  plain = rng.normal(1.0, 0.2, (b, 1, h))
  plain -= np.maximum(plain.mean(0, keepdims=True) - 1.0, 0)  # every head's mean <= 1
  x[..., 1] = plain
  tests, settings = hypothesis_tests(x, ("block", "block_plain"))
  out, _ = cal.apply_rule(tests, settings, x, ("block", "block_plain"), lengths)
  block = out[out["role"] == "block"]
  assert block["assigned_paper"].all() and not block["assigned_calibrated"].any()
  assert (block["p_block_plain"] >= 0.5).all()


def test_near_uniform_divergence_by_hand():
  """A row uniform over m of n positions has entropy ln m: divergence ln(n / m)."""
  lengths = np.array([40, 80])
  m = np.array([[38, 20], [76, 40]])                 # [b, h]: 95% and 50% of the positions
  entropy = np.log(m)[:, None, :]                    # [b, l=1, h]
  d = cal.divergence_from_uniform(entropy, lengths)
  np.testing.assert_allclose(d, [[np.log(40 / 38), np.log(2)]])  # 0.0513 and 0.693 nats
  assert cal.near_uniform_heads(entropy, lengths).tolist() == [[True, False]]
  assert cal.near_uniform_heads(entropy, lengths, nats=0.05).tolist() == [[False, False]]


def test_apply_rule_errors():
  x = np.ones((3, 1, 1, 1))
  tests, settings = hypothesis_tests(x, ("block",))
  with pytest.raises(ValueError, match="block_plain"):
    cal.apply_rule(tests, settings, x, ("block",), [30, 30, 30])
  with pytest.raises(ValueError, match="rule"):
    cal.apply_rule(tests, settings, x, ("block",), [30, 30, 30], rule="strict")
  with pytest.raises(ValueError, match="hypothesis_tests"):
    cal.apply_rule(tests.drop(columns=["assigned"]), settings, x, ("block",), [30, 30, 30])


def test_tests_csv_round_trip_keeps_both_decisions(tmp_path):
  batch = _batch(True, seed=5, b=12)
  sb, ent = (np.asarray(x) for x in _scores(_heads(batch, ["uniform", "block"]), batch))
  lengths = batch["attention_mask"].sum(-1)
  tests, settings, _ = _decide(sb, ent, lengths)
  contract.write_tests(tests, settings, tmp_path)
  back, back_settings = contract.read_tests(tmp_path)
  assert tuple(back.columns) == contract.TEST_COLUMNS + contract.RULE_COLUMNS
  for c in contract.RULE_BOOL_COLUMNS + ("assigned",):
    assert back[c].dtype == bool and (back[c] == tests[c]).all(), c
  assert back_settings["rule"] == "calibrated"
  with pytest.raises(ValueError, match="columns"):
    contract.write_tests(tests.drop(columns=["p_uniform"]), settings, tmp_path)


@pytest.mark.slow
def test_random_model_gets_no_role_on_sentences_and_pairs(tmp_path, size="mini"):
  """A randomly initialised BERT through the whole analysis (UD EWT sentences with gold parses and
  MRPC pairs): no role under the default rule; the paper's rule calls its heads block heads."""
  from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.checkpoint import build_model, save_model
  from heads_jax.model.config import config_for
  tok = load_tokenizer(None)
  model_dir = save_model(build_model("BertModel", config_for(size, vocab_size=tok.vocab_size)),
                         tmp_path / "model", tok)
  cfg = AnalysisConfig(model=str(model_dir), data=("ud-ewt", "mrpc"), out=str(tmp_path / "out"),
                       max_examples=24, parser="none", report=False)
  host = run_analysis(cfg, progress=False, log=lambda *a: None)
  tests = host["tests"]
  assert not tests["assigned"].any()
  assert host["summary"]["share_unskilled"] == 1.0 and host["summary"]["share_block"] == 0.0
  paper = tests[tests["assigned_paper"]]
  assert set(paper["role"]) == {"block"}                   # the artefact the rule removes
  assert host["summary"]["by_rule"]["paper"]["share_block"] > 0.5
  assert tests["near_uniform"].all()


def test_average_rule_is_the_mean_above_tau_without_a_test():
  """--rule average: the mean above tau decides, whatever the test says (Pande et al. Fig. 2)."""
  from heads_jax.hoststats import roles as roles_lib
  from heads_jax.hoststats import summary
  rng = np.random.default_rng(1)
  roles = ("local", "cls")
  x = rng.normal(1.0, 0.1, size=(30, 1, 3, 2))
  x[:, 0, 0, 0] = np.r_[np.full(27, 1.0), [30.0, 30.0, 30.0]]   # mean 3.9, skewed: test fails
  x[:, 0, 1, 0] = rng.normal(5.0, 0.2, 30)                      # clearly above tau
  x[:2, 0, 2, 1] = np.nan                                       # NaN values are left out
  tests, settings = hypothesis_tests(x, roles, tau=3.0)
  out, s = cal.apply_rule(tests, settings, x, roles, np.full(30, 20), rule="average")
  assert s["rule"] == "average"
  assigned = out.set_index(["layer", "head", "role"])["assigned"]
  assert assigned[(0, 0, "local")] and not out.set_index(["layer", "head", "role"]).loc[
      (0, 0, "local"), "assigned_paper"]
  assert assigned[(0, 1, "local")] and not assigned[(0, 2, "cls")]
  np.testing.assert_array_equal(roles_lib.average_rule([np.nan, 3.0, 3.1], 3.0), [False, False, True])
  with pytest.raises(ValueError, match="tau"):
    roles_lib.rule_assigned(out, "average")
  fig = summary.summary_figures(x, roles, out, rule="average", tau=3.0)
  assert fig["by_rule"]["average"]["num_assigned_by_role"] == {"local": 2, "cls": 0}
  assert fig["by_rule"]["paper"]["num_assigned_by_role"]["local"] == 1


def _pair_batch(n: int, packed_with: int = 0) -> dict:
  """One sentence pair of ``n`` positions, ``[CLS] A [SEP] B [SEP]`` with A and B of equal
  length, every position one word, each word the nsubj dependent of the word 1-3 positions
  away (cycling 1, 2, 3; to its right, near the end to its left); with ``packed_with`` a second, single sentence of
  that many positions follows in the same row (a packed row, ``segment_ids``)."""
  la = (n - 3) // 2
  k = n + packed_with
  tc = np.full(k, B.TOKEN_OTHER)
  tc[[0, la + 1, n - 1]] = [B.TOKEN_CLS, B.TOKEN_SEP, B.TOKEN_SEP]
  tt = np.zeros(k, np.int64)
  tt[la + 2:n] = 1
  word = np.arange(k)
  step = 1 + word % 3
  head = np.where(word + step < n, word + step, word - step)
  rel = np.full(k, B.REL_NSUBJ)
  seg = np.ones(k, np.int64)
  if packed_with:
    seg[n:] = 2
    tc[n], tc[k - 1] = B.TOKEN_CLS, B.TOKEN_SEP
    word[n:] = np.arange(packed_with)
    head[n:], rel[n:] = -1, B.REL_NONE
  batch = {"attention_mask": np.ones((1, k), np.int64), "token_type_ids": tt[None],
           "token_class": tc[None], "word_ids": word[None], "dep_head": head[None],
           "dep_rel": rel[None]}
  if packed_with:
    batch["segment_ids"] = seg[None]
  return batch


def _direct_window_uniform(batch, role: str, window: int) -> float:
  """Uniform attention over each query's window, its sieve bias by a loop over the queries of
  the first sequence of the row: beta(t) = mean over S(t) of a[t, s] / mean over all s of
  a[t, s], with a[t, s] = 1 / m_t inside the window (block: times the row entropy ln m_t)."""
  seg = batch.get("segment_ids", batch["attention_mask"])[0]
  n = int((seg == 1).sum())
  sieve = np.asarray(build_sieves(batch, [role]))[0, 0, :n, :n]
  values = []
  for t in range(n):
    keys = [s for s in range(n) if abs(s - t) <= window]
    a = np.zeros(n)
    a[keys] = 1.0 / len(keys)
    in_sieve = np.flatnonzero(sieve[t])
    if len(in_sieve) == 0:
      continue
    beta = a[in_sieve].mean() / a.mean()
    if role in cal.ENTROPY_WEIGHTED:
      beta *= -(a[keys] * np.log(a[keys])).sum()
    values.append(beta)
  return float(np.mean(values))


@pytest.mark.slow
@pytest.mark.parametrize("n, expect", [(128, {"block_plain": 1.38, "block": 6.22}),
                                       (384, {"block_plain": 1.84, "block": 8.72,
                                              "nsubj": 3.36})])
def test_windowed_baselines_from_the_actual_sieves(n, expect):
  """ModernBERT's local layers (half window 64): uniform attention over the window scores what
  a direct loop over the queries gives for every role (block_plain 1.38 / block 6.22 at 128
  tokens, 1.84 / 8.72 at 384, a relation 1-3 tokens away 3.36 at 384: the issue's values),
  not the 1 (block: mean ln m_t) of full attention; a packed row gives each sequence the
  value it has alone; full attention gives 1 and ln n."""
  roles = ("block", "block_plain", "sep", "delimiter", "cls", "local", "nsubj")
  batch = _pair_batch(n)
  got = cal.sieve_uniform(np.asarray(build_sieves(batch, roles)), batch["attention_mask"], roles,
                          64)[0]
  for j, role in enumerate(roles):
    assert got[j] == pytest.approx(_direct_window_uniform(batch, role, 64), rel=1e-9), role
  for role, value in expect.items():
    assert got[roles.index(role)] == pytest.approx(value, abs=0.005), role
  assert got[roles.index("block")] > cal.uniform_entropy([n], 64)[0] + 1     # not mean ln m_t
  packed = _pair_batch(n, packed_with=40)
  both = cal.sieve_uniform(np.asarray(build_sieves(packed, roles)), packed["segment_ids"], roles,
                           64, slots=2)
  np.testing.assert_allclose(both[0], got, rtol=1e-12)
  assert np.isnan(both[1, roles.index("block")]) and np.isnan(both[1, roles.index("nsubj")])
  full = cal.sieve_uniform(np.asarray(build_sieves(batch, roles)), batch["attention_mask"], roles,
                           None)[0]
  np.testing.assert_allclose(full, cal.uniform_values([n], roles)[0], rtol=1e-12)


def test_calibrated_columns_take_the_recorded_baselines():
  """The calibrated rule's u_i is the recorded per-sequence baseline where the run has one."""
  rng = np.random.default_rng(0)
  x = rng.normal(2.0, 0.1, (6, 2, 1, 1))
  u = np.stack([np.full((6, 1), 1.0), np.full((6, 1), 2.5)], axis=1)             # [b, l, r]
  df = cal.calibrated_columns(x, ["block_plain"], np.full(6, 20), np.full(2, 0.01), alpha=0.05,
                              uniform=u)
  np.testing.assert_allclose(df["uniform"], [1.0, 2.5])
  assert df["assigned_calibrated"].tolist() == [True, False]     # 2.0 beats 1.0, not 2.5
