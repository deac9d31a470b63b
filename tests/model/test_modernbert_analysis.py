"""Roles that know what a head can see (issue 40 item 2): a head planted to attend uniformly in a
windowed ModernBERT layer is near-uniform under the calibrated rule with the model's windows,
not local (without the windows, the old rule calls it local: the window, not the head, makes
its attention local)."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from heads_jax.data.specs import encode_spec  # noqa: E402
from heads_jax.data.vocabulary import ROLES  # noqa: E402
from heads_jax.hoststats.calibration import (apply_rule, uniform_entropy, uniform_values,  # noqa: E402
                                             windows_from_settings)
from heads_jax.hoststats.hypothesis import hypothesis_tests  # noqa: E402
from heads_jax.model.loading import layer_windows, load_model  # noqa: E402
from heads_jax.pipelines.device_pass import sequence_fields  # noqa: E402
from heads_jax.stats.step import make_analysis_step  # noqa: E402
from tests.family_models import save_family_dir  # noqa: E402

LAYER, HEAD = 1, 2   # layer 1 is local (window |s - t| <= 4)


def _planted(tmp_path):
  save_family_dir("modernbert", tmp_path, seed=7)
  model, tok = load_model(tmp_path)
  # Zero the head's query weights: its scores are 0, its attention uniform over what it sees.
  kernel = model.layers[LAYER].attention.qkv.kernel
  e = model.config.head_dim
  value = np.array(kernel.value)
  value[:, HEAD * e:(HEAD + 1) * e] = 0.0
  kernel.value = value
  return model, tok


@pytest.mark.slow
def test_planted_uniform_head_in_a_windowed_layer_is_near_uniform_not_local(tmp_path):
  model, tok = _planted(tmp_path)
  windows = layer_windows(tmp_path)
  assert windows == (None, 4, 4, None)
  _, batches, _ = encode_spec("ud-ewt", tok, max_length=64, batch_size=32, max_examples=24,
                              parser="none")
  step = make_analysis_step(model, roles=ROLES, measures=True)
  out = {"sieve_bias": [], "entropy": [], "lengths": [], "uniform": []}
  for indices, batch in batches:
    keep = indices >= 0
    batch = {k: v[keep] for k, v in batch.items()}
    res = step(batch)
    out["sieve_bias"].append(res["sieve_bias"])
    out["entropy"].append(res["entropy"])
    out["lengths"].append(batch["attention_mask"].sum(1))
    out["uniform"].append(sequence_fields(batch, 0, roles=ROLES, direction="dep2head",
                                          windows=windows)["uniform"])
  x, entropy, lengths, uniform = (np.concatenate(v) for v in out.values())
  # The device pass's recorded baselines (every role, from each sequence's sieves) are what the
  # planted head, uniform over its window in the real model, scores.
  np.testing.assert_allclose(x[:, LAYER, HEAD], uniform[:, LAYER], rtol=1e-4, equal_nan=True)
  assert np.nanmean(uniform[:, LAYER, ROLES.index("syntactic")]) > 1.5   # not taken as 1
  assert lengths.mean() > 3 * 9   # sequences well beyond the 9 keys a local head sees
  # The planted head's attention is exactly uniform over its window: its entropy and its local
  # sieve bias are what uniform_entropy / uniform_values say.
  np.testing.assert_allclose(entropy[:, LAYER, HEAD], uniform_entropy(lengths, 4), atol=1e-4)
  local = ROLES.index("local")
  np.testing.assert_allclose(x[:, LAYER, HEAD, local], uniform_values(lengths, ROLES, 4)[:, local],
                             rtol=1e-4)
  tests, settings = hypothesis_tests(x, ROLES)
  row = (tests["layer"] == LAYER) & (tests["head"] == HEAD) & (tests["role"] == "local")
  old, old_settings = apply_rule(tests, settings, x, ROLES, lengths, entropy=entropy)
  assert bool(old.loc[row, "assigned"].iloc[0])                       # called local ...
  assert f"{LAYER}:{HEAD}" not in old_settings["near_uniform_heads"]
  new, new_settings = apply_rule(tests, settings, x, ROLES, lengths, entropy=entropy,
                                 windows=windows)
  assert f"{LAYER}:{HEAD}" in new_settings["near_uniform_heads"]      # ... but it is uniform
  assert not new.loc[(new["layer"] == LAYER) & (new["head"] == HEAD), "assigned"].any()
  assert new.loc[row, "uniform"].iloc[0] > 2 and new_settings["windowed_layers"] == [1, 2]
  assert windows_from_settings(new_settings, 4) == windows                # read back from tests.json


@pytest.mark.slow
def test_analyze_end_to_end_matches_transformers_attention(tmp_path):
  """`heads-jax analyze` on a random ModernBERT directory (sentences and pairs longer than the
  window): scores equal the plain-loop reference on transformers' eager attention, with the
  [CLS] and [SEP] roles defined and the pairs' block role too."""
  import torch

  from heads_jax.cli import main as cli_main
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.data.vocabulary import TOKEN_CLS, TOKEN_SEP
  from tests import reference_impl as ref
  from tests.helpers import REPO
  hf, _ = save_family_dir("modernbert", tmp_path / "model", seed=5)
  data = ("ud-ewt", f"tsv:{REPO / 'tests' / 'fixtures' / 'pairs.tsv'}:header")
  out = tmp_path / "out"
  args = ["analyze", "--model", str(tmp_path / "model"), "--out", str(out), "--parser", "none",
          "--max-examples", "6", "--max-length", "48", "--batch-size", "8"]
  for spec in data:
    args += ["--data", spec]
  assert cli_main(args) == 0
  for name in ("scores.npz", "tests.csv", "tests.json", "summary.json", "report.html"):
    assert (out / name).is_file(), name
  z = np.load(out / "scores.npz")
  tok = load_tokenizer(tmp_path / "model")
  sieve = []
  for spec in data:
    _, it, _ = encode_spec(spec, tok, max_examples=6, max_length=48, batch_size=16,
                           syntax=spec == "ud-ewt", parser="none")
    indices, batch = next(iter(it))
    keep = indices >= 0
    batch = {k: v[keep][np.argsort(indices[keep])] for k, v in batch.items()}
    assert (batch["token_class"][:, 0] == TOKEN_CLS).all()
    assert ((batch["token_class"] == TOKEN_SEP).sum(1) == (2 if spec != "ud-ewt" else 1)).all()
    with torch.no_grad():
      attn = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long),
                output_attentions=True).attentions
    attn = torch.stack(attn, dim=1).double().numpy()
    sieve.append(ref.sieve_bias(attn, batch, ROLES))
  sieve = np.concatenate(sieve)
  assert z["sieve_bias"].shape == (8, 4, 4, len(ROLES))
  np.testing.assert_allclose(z["sieve_bias"], sieve, rtol=2e-5, atol=2e-5, equal_nan=True)
  for role in ("cls", "sep", "delimiter"):
    assert not np.isnan(z["sieve_bias"][..., ROLES.index(role)]).any(), role
  assert not np.isnan(z["sieve_bias"][6:, ..., ROLES.index("block")]).any()
  # The windowed layers are named, and their heads judged against uniform attention over the
  # window: the random heads of the local layers are near-uniform, not block or local heads.
  import json
  settings = json.loads((out / "tests.json").read_text())["settings"]
  assert settings["windowed_layers"] == [1, 2] and settings["window"] == 4
  assert {f"{l}:{h}" for l in (1, 2) for h in range(4)} <= set(settings["near_uniform_heads"])


def test_role_shares_of_local_and_global_layers_by_hand():
  import pandas as pd

  from heads_jax.hoststats.calibration import shares_by_layer_kind
  rows = [dict(layer=l, head=h, role=r, weighting=w,
               assigned=w == "attention" and ((l == 1 and r == "local") or (l, h, r) == (0, 0, "delimiter")))
          for w in ("attention", "norm") for l in range(3) for h in range(2)
          for r in ("local", "delimiter", "cls", "sep", "block", "block_plain")]
  settings = {"windowed_layers": [1, 2], "near_uniform_heads": ["2:0", "2:1", "0:1"]}
  s = shares_by_layer_kind(pd.DataFrame(rows), settings)
  assert s["local"]["layers"] == [1, 2] and s["local"]["num_heads"] == 4
  assert (s["local"]["share_local"], s["local"]["share_near_uniform"], s["local"]["share_unskilled"]) == (0.5, 0.5, 0.5)
  assert (s["global"]["share_delimiter"], s["global"]["share_local"], s["global"]["share_near_uniform"]) == (0.5, 0.0, 0.5)
  assert shares_by_layer_kind(pd.DataFrame(rows), {}) is None
