"""Fine-tuning and ablation beyond BERT: a tiny random RoBERTa fine-tuned on a separable
synthetic pair task in MRPC's layout (local GLUE TSV), exported to Hugging Face (transformers'
RobertaForSequenceClassification gives the same logits), then ablated (intra/inter-sentence
attention removal on MRPC pairs, head importance); the same ablation on a random ALBERT
classifier, whose shared layers are gated per applied layer."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax import load_model
from heads_jax.pipelines.ablate import AblationConfig, run_ablation
from heads_jax.data.glue import GlueExample
from heads_jax.data.glue_batches import encode_labelled
from tests.family_models import save_family_dir

pytestmark = pytest.mark.slow

POS = "good great happy fine nice love best wonderful".split()
NEG = "bad awful sad poor hate worst terrible ugly".split()
FILLER = "the movie was a and it film story".split()


def _mrpc_dir(root, n_train=256, n_dev=64):
  """A separable pair task in MRPC's TSV layout (label: sentence B's sentiment), so that the
  classifier is an MRPC classifier and its ablation on MRPC pairs is a same-task evaluation."""
  rng = np.random.default_rng(0)
  d = root / "MRPC"
  d.mkdir(parents=True)
  for split, n in (("train", n_train), ("dev", n_dev)):
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(n):
      y = int(rng.integers(0, 2))
      a = " ".join(rng.choice(FILLER, 4))
      words = list(rng.choice(FILLER, 3)) + list(rng.choice(POS if y else NEG, 2))
      rng.shuffle(words)
      lines.append(f"{y}\t{2 * i}\t{2 * i + 1}\t{a}\t{' '.join(words)}")
    (d / f"{split}.tsv").write_text("\n".join(lines) + "\n")
  return root


def _ablate(model_dir, out):
  cfg = AblationConfig(model=str(model_dir), data="mrpc", out=str(out), cross="both",
                       heads="0:0,1:1", importance=True, max_examples=32, max_length=48,
                       batch_size=16, random_seeds=1)
  res = run_ablation(cfg, log=lambda *a: None)
  seg = pd.read_csv(out / "segment_ablation.csv")
  assert set(seg["ablation"]) >= {"intra", "inter"}
  # MRPC pairs: removing inter-sentence attention changes the loss only if the two sentences'
  # segments are told apart (RoBERTa has no token types; the segments come from the template).
  for part in ("intra", "inter"):
    assert float(seg.loc[seg["ablation"] == part, "loss_change"].iloc[0]) != 0.0, part
  imp = np.load(out / "importance.npy")
  L, H = res["settings"]["layers"], res["settings"]["heads"]
  assert imp.shape == (L, H) and np.isfinite(imp).all() and (imp > 0).any()
  return res, seg


def test_roberta_finetune_export_and_ablation(tmp_path):
  model_dir = tmp_path / "roberta"
  # hidden 64 (not the parity tests' 32): LAMB fine-tunes the width-32 model far more slowly
  save_family_dir("roberta", model_dir, seed=7, hidden_size=64, intermediate_size=128)
  from tests.model.finetune_check import finetune_tiny_mrpc  # it imports this module's _mrpc_dir
  finetune_tiny_mrpc(model_dir, tmp_path)  # accuracy >= 0.9 asserted there
  run = tmp_path / "run"
  model, tok = load_model(run / "best_model", head="auto")
  assert model.config.family == "roberta" and type(tok).__name__ == "RobertaTokenizer"
  rows = [GlueExample("the movie was a", f"it {w} {w} film", int(w in POS), i)
          for i, w in enumerate(POS + NEG)]
  enc = encode_labelled(rows, tok, 32)
  ours = np.asarray(model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])["logits"])
  written = json.loads((run / "best_hf" / "config.json").read_text())
  assert written["architectures"] == ["RobertaForSequenceClassification"]
  hf = transformers.RobertaForSequenceClassification.from_pretrained(str(run / "best_hf")).eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(enc["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(enc["attention_mask"], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=2e-4)
  assert np.mean(ours.argmax(-1) == enc["labels"]) >= 0.9
  res, seg = _ablate(run / "best_model", tmp_path / "ablate")
  assert res["baseline"]["n"] == 32


def test_albert_classifier_ablation_gates_applied_layers(tmp_path):
  model_dir = tmp_path / "albert"
  save_family_dir("albert", model_dir, task="ForSequenceClassification", seed=8, initializer_range=0.2)
  res, seg = _ablate(model_dir, tmp_path / "ablate")
  assert (res["settings"]["layers"], res["settings"]["heads"]) == (4, 4)  # 4 applied layers, 2 groups
  imp = np.load(tmp_path / "ablate" / "importance.npy")
  # Layers 0 and 1 share weights (group 0) but are gated separately: their importances differ.
  assert not np.allclose(imp[0], imp[1])
