"""`heads-jax compare` (heads_jax.pipelines.compare) on the stage engine: a rerun reuses, a
changed analysis reruns the comparison and the report, --redo; the attention similarity of two
models (Kovaleva et al. 2019)."""

import numpy as np
import pandas as pd
import pytest
from flax import nnx

from heads_jax import contract, runfiles
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.heads import BertForSequenceClassification
from heads_jax.pipelines.compare import attention_similarity_section, run_compare
from tests.hoststats.test_compare import AFTER_ROLES, _pair, _write_run
from tests.pipelines.test_ablate import _stage_states


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64,
                   initializer_range=0.2)
  path = tmp_path_factory.mktemp("model") / "m"
  save_model(BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(0)), path, tok,
             id2label={0: "not_equivalent", 1: "equivalent"})
  return path


@pytest.mark.slow
def test_compare_attention_similarity_section(tiny_dir, tmp_path):
  lines = []
  sec = attention_similarity_section(tiny_dir, tiny_dir, tmp_path, data="mrpc", max_examples=6,
                                     max_length=64, log=lines.append)
  table = pd.read_csv(tmp_path / "attention_similarity.csv")
  assert len(table) == 8 and np.allclose(table["cosine"], 1.0, atol=1e-5)
  assert "Kovaleva" in sec["html"] and (tmp_path / "figures" / "attention_similarity.png").is_file()
  assert "mean cosine 1.000" in lines[0]
  with pytest.raises(UserError, match="--data"):
    attention_similarity_section(tiny_dir, tiny_dir, tmp_path)


@pytest.mark.slow
def test_rerun_reuses_and_a_changed_analysis_reruns(tmp_path):
  before, after = _pair(tmp_path)
  out = tmp_path / "cmp"

  def run(**kw):
    lines = []
    report = run_compare(before, after, out, log=lines.append, **kw)
    return report, _stage_states(lines), lines

  report, states, _ = run()
  assert states == {"comparison": "run", "report": "run"} and report == out / "report.html"
  roles = pd.read_csv(out / contract.COMPARE_ROLES_CSV)
  _, states, lines = run()
  assert states == {"comparison": "reused", "report": "reused"}
  assert any("heads that gained a role: 2, lost a role: 1" in line for line in lines)
  _, states, _ = run(redo="report")
  assert states == {"comparison": "reused", "report": "run"}
  # the after analysis rewritten behind the same path with other roles: both stages rerun
  changed = {**AFTER_ROLES, (4, 1): {"local"}}
  _write_run(after, True, assigned=changed, clusters={(l, h): "dense" for l in range(6)
                                                      for h in range(2)})
  _, states, lines = run()
  assert states == {"comparison": "run", "report": "run"}
  new_roles = pd.read_csv(out / contract.COMPARE_ROLES_CSV)
  assert not new_roles.equals(roles)
  assert any("heads that gained a role: 3" in line for line in lines)
  assert runfiles.read_job(out)["kind"] == "comparison"
  with pytest.raises(UserError, match="--redo 'bogus'"):
    run(redo="bogus")


def test_a_model_that_is_not_the_analysed_one_is_refused(tiny_dir, tmp_path):
  # Before (issue 43 item 6): accepted; its similarity reported beside the other model's roles.
  from heads_jax import contract
  before, after = _pair(tmp_path)
  for d in (before, after):
    contract.write_run(d, {"model": str(tiny_dir), "data": ["mrpc"]}, [],
                       inputs={"model": runfiles.model_identity(tiny_dir), "data": []})
  tok = load_tokenizer(None)
  cfg = config_for("tiny", vocab_size=tok.vocab_size, max_position_embeddings=64)
  other = tmp_path / "other"
  save_model(BertForSequenceClassification(cfg, 2, rngs=nnx.Rngs(5)), other, tok)
  with pytest.raises(UserError, match="--after-model .* is not the model the analysis"):
    run_compare(before, after, tmp_path / "cmp", before_model=tiny_dir, after_model=other,
                data="mrpc", log=lambda m: None)
  assert not (tmp_path / "cmp").exists()
