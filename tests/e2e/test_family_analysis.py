"""`heads-jax analyze` on random-weight RoBERTa and ALBERT directories: the contract files of
DESIGN.md section 4, and scores equal to the plain-loop reference (tests/reference_impl.py) on
attention maps computed by transformers' own RobertaModel / AlbertModel (eager)."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax.cli import main as cli_main
from heads_jax.data.vocabulary import ROLES, TOKEN_SEP
from heads_jax.data.specs import encode_spec
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.stats.examples import decode_map
from tests import reference_impl as ref
from tests.family_models import save_family_dir
from tests.helpers import REPO

pytestmark = pytest.mark.slow
N_UD = 6
DATA = ("ud-ewt", f"tsv:{REPO / 'tests' / 'fixtures' / 'pairs.tsv'}:header")


@pytest.fixture(scope="module", params=["roberta", "albert"])
def run(request, tmp_path_factory):
  family = request.param
  model_dir = tmp_path_factory.mktemp(f"{family}_model")
  hf, _ = save_family_dir(family, model_dir, seed=5)
  out = tmp_path_factory.mktemp(f"{family}_analysis")
  args = ["analyze", "--model", str(model_dir), "--out", str(out), "--parser", "none",
          "--max-examples", str(N_UD), "--max-length", "48", "--batch-size", "8"]
  for spec in DATA:
    args += ["--data", spec]
  assert cli_main(args) == 0
  return family, model_dir, out, hf


def _reference(family, model_dir, hf):
  tok = load_tokenizer(model_dir)
  sieve, dist, batches = [], [], []
  for spec in DATA:
    _, it, n = encode_spec(spec, tok, max_examples=N_UD, max_length=48, batch_size=16, syntax=spec == "ud-ewt",
                           parser="none")
    indices, batch = next(iter(it))
    keep = indices >= 0
    batch = {k: v[keep] for k, v in batch.items()}
    order = np.argsort(indices[keep])
    kw = {"input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
          "attention_mask": torch.tensor(batch["attention_mask"], dtype=torch.long)}
    if family == "albert":
      kw["token_type_ids"] = torch.tensor(batch["token_type_ids"], dtype=torch.long)
    with torch.no_grad():
      attn = torch.stack(hf(**kw, output_attentions=True).attentions, dim=1).double().numpy()
    sieve.append(ref.sieve_bias(attn, batch, ROLES)[order])
    dist.append(ref.distance_features(attn, batch)[order])
    batches.append({k: v[order] for k, v in batch.items()})
  return np.concatenate(sieve), np.concatenate(dist), batches


def test_contract_files_and_scores_match_transformers_attention(run):
  family, model_dir, out, hf = run
  for name in ("scores.npz", "tests.csv", "tests.json", "clusters.csv", "summary.json", "report.html"):
    assert (out / name).is_file(), name
  assert list((out / "figures").glob("*.png"))
  z = np.load(out / "scores.npz")
  layers = hf.config.num_hidden_layers * getattr(hf.config, "inner_group_num", 1)
  n = N_UD + 2
  assert z["sieve_bias"].shape == (n, layers, 4, len(ROLES)) and tuple(z["roles"]) == ROLES
  sieve_ref, dist_ref, batches = _reference(family, model_dir, hf)
  np.testing.assert_array_equal(np.isnan(z["sieve_bias"]), np.isnan(sieve_ref))
  np.testing.assert_allclose(z["sieve_bias"], sieve_ref, rtol=2e-5, atol=2e-5, equal_nan=True)
  np.testing.assert_allclose(z["distance"], dist_ref, atol=1e-5)
  # The pairs: block is defined, the separators are the template's (RoBERTa: three </s>).
  pairs = batches[1]
  seps = (pairs["token_class"] == TOKEN_SEP).sum(1)
  assert seps.tolist() == [3 if family == "roberta" else 2] * 2
  assert not np.isnan(z["sieve_bias"][N_UD:, ..., ROLES.index("block")]).any()
  assert np.isnan(z["sieve_bias"][:N_UD, ..., ROLES.index("block")]).all()
  assert not np.isnan(z["sieve_bias"][:N_UD, ..., ROLES.index("syntactic")]).all()
  tests = pd.read_csv(out / "tests.csv")  # attention rows, and the second pass's norm-weighted ones
  assert (tests["weighting"] == "attention").sum() == layers * 4 * len(ROLES)
  assert set(tests["weighting"]) == {"attention", "norm"}
  settings = json.loads((out / "tests.json").read_text())["settings"]
  assert settings["model"] == str(model_dir)


def test_head_view_examples_are_transformers_attention(run):
  """examples.json: each head's examples are the chosen sequences, their maps transformers'
  attention on them (to 1/510), their tokens the tokenizer's; the report embeds the view."""
  family, model_dir, out, hf = run
  doc = json.loads((out / "examples.json").read_text())
  layers = hf.config.num_hidden_layers * getattr(hf.config, "inner_group_num", 1)
  assert len(doc["heads"]) == layers * 4 and all(len(h["examples"]) >= 1 for h in doc["heads"])
  z = np.load(out / "scores.npz")
  tok = load_tokenizer(model_dir)
  seen = 0
  for h in doc["heads"]:
    for x in h["examples"]:
      seq = doc["sequences"][x["sequence"]]
      n = len(seq["tokens"])
      assert n == z["lengths"][seq["index"]]
      np.testing.assert_allclose(x["score"], z["sieve_bias"][seq["index"], h["layer"], h["head"],
                                                           ROLES.index(x["role"])], rtol=1e-6)
      ids = tok.convert_tokens_to_ids(seq["tokens"])
      kw = {"input_ids": torch.tensor([ids], dtype=torch.long)}
      if family == "albert":
        kw["token_type_ids"] = torch.tensor([seq["segments"]], dtype=torch.long)
      with torch.no_grad():
        att = hf(**kw, output_attentions=True).attentions[h["layer"]][0, h["head"]].numpy()
      np.testing.assert_allclose(decode_map(x["map"], n), att, atol=0.5 / 255 + 1e-5)
      seen += 1
  assert seen >= 8
  assert 'id="hv-data"' in (out / "report.html").read_text()
