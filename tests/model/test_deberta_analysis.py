"""`heads-jax analyze` end to end on a random-weight DeBERTa-v3 directory as the hub ships one
(config.json, weights, spm.model): the contract files, scores equal to the plain-loop reference
(tests/reference_impl.py) on the attention maps of transformers' own DebertaV2Model (eager), the
[CLS] and [SEP] roles defined on every sequence."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax import contract
from heads_jax.cli import main as cli_main
from heads_jax.data.specs import encode_spec
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.data.vocabulary import ROLES, TOKEN_CLS, TOKEN_SEP
from tests import reference_impl as ref
from tests.helpers import REPO
from tests.model.test_deberta import save_deberta_dir

pytestmark = pytest.mark.slow
N_UD = 6
DATA = ("ud-ewt", f"tsv:{REPO / 'tests' / 'fixtures' / 'pairs.tsv'}:header")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("deberta_model")
  hf, _ = save_deberta_dir(model_dir, seed=5)
  out = tmp_path_factory.mktemp("deberta_analysis")
  args = ["analyze", "--model", str(model_dir), "--out", str(out), "--parser", "none",
          "--max-examples", str(N_UD), "--max-length", "48", "--batch-size", "8"]
  for spec in DATA:
    args += ["--data", spec]
  assert cli_main(args) == 0
  return model_dir, out, hf


def _reference(model_dir, hf):
  tok = load_tokenizer(model_dir)
  sieve, dist, batches = [], [], []
  for spec in DATA:
    _, it, _ = encode_spec(spec, tok, max_examples=N_UD, max_length=48, batch_size=16,
                           syntax=spec == "ud-ewt", parser="none")
    indices, batch = next(iter(it))
    keep = indices >= 0
    batch = {k: v[keep] for k, v in batch.items()}
    order = np.argsort(indices[keep])
    with torch.no_grad():
      out = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
               attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long),
               output_attentions=True)
    attn = torch.stack(out.attentions, dim=1).double().numpy()
    sieve.append(ref.sieve_bias(attn, batch, ROLES)[order])
    dist.append(ref.distance_features(attn, batch)[order])
    batches.append({k: v[order] for k, v in batch.items()})
  return np.concatenate(sieve), np.concatenate(dist), batches


def test_analysis_of_a_deberta_directory(run):
  model_dir, out, hf = run
  for name in ("scores.npz", "tests.csv", "tests.json", "clusters.csv", "summary.json",
               "report.html", "measures.npz", "examples.json"):
    assert (out / name).is_file(), name
  z = np.load(out / "scores.npz")
  layers, heads = hf.config.num_hidden_layers, hf.config.num_attention_heads
  n = N_UD + 2
  assert z["sieve_bias"].shape == (n, layers, heads, len(ROLES)) and tuple(z["roles"]) == ROLES
  sieve_ref, dist_ref, batches = _reference(model_dir, hf)
  np.testing.assert_array_equal(np.isnan(z["sieve_bias"]), np.isnan(sieve_ref))
  np.testing.assert_allclose(z["sieve_bias"], sieve_ref, rtol=2e-5, atol=2e-5, equal_nan=True)
  np.testing.assert_allclose(z["distance"], dist_ref, atol=1e-5)
  # [CLS] and [SEP] are found: one [CLS] first, the template's separators (one per segment), and
  # their roles are defined on every sequence.
  for batch, seps in zip(batches, (1, 2)):
    assert (batch["token_class"][:, 0] == TOKEN_CLS).all()
    assert ((batch["token_class"] == TOKEN_SEP).sum(1) == seps).all()
  for role in ("cls", "sep", "delimiter"):
    assert not np.isnan(z["sieve_bias"][..., ROLES.index(role)]).any(), role
  assert not np.isnan(z["sieve_bias"][N_UD:, ..., ROLES.index("block")]).any()
  tests = pd.read_csv(out / "tests.csv")
  assert (tests["weighting"] == "attention").sum() == layers * heads * len(ROLES)
  assert set(tests["weighting"]) == {"attention", "norm"}
  assert json.loads((out / "tests.json").read_text())["settings"]["model"] == str(model_dir)
  m = contract.read_measures(out)
  assert m["entropy"].shape == (n, layers, heads)


def test_term_shares_in_the_measures(run):
  """measures.npz holds each sequence's term shares, as the model computes them on the same
  encoded sequences (their values are checked against transformers' terms in test_deberta.py)."""
  from heads_jax import load_model
  model_dir, out, hf = run
  m = contract.read_measures(out)
  n, layers, heads = N_UD + 2, hf.config.num_hidden_layers, hf.config.num_attention_heads
  assert m["term_names"] == contract.TERM_NAMES == ("c2c", "c2p", "p2c")
  shares = m["term_shares"]
  assert shares.shape == (n, layers, heads, 3) and np.isfinite(shares).all()
  np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-4)
  model, _ = load_model(model_dir)
  _, _, batches = _reference(model_dir, hf)
  expect = np.concatenate([np.asarray(model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                                            return_term_shares=True)["term_shares"])
                           for b in batches])
  np.testing.assert_allclose(shares, expect, atol=1e-5)
  # summary.json: the means over the sequences, and the report's figure of them.
  summary = json.loads((out / "summary.json").read_text())["term_shares"]
  assert summary["terms"] == ["c2c", "c2p", "p2c"] and summary["num_sequences"] == n
  np.testing.assert_allclose(np.array(summary["per_head"], float), shares.mean(0), atol=1e-4)
  assert len(summary["positional_heads"]) + len(summary["content_heads"]) == layers * heads
  assert (out / "figures" / "measures_term_shares.png").is_file()
  assert "One panel per term; each cell is one head" in (out / "report.html").read_text()
