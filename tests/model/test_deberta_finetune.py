"""`heads-jax finetune` on DeBERTa-v3 (issue 40 item 6): a tiny random DeBERTa-v3 directory as the
hub ships one (spm.model; the embedding table one row larger than the tokenizer's base vocabulary,
for the added [MASK], as deberta-v3-base's 128100 rows for 128001 pieces) fine-tuned on a
separable synthetic pair task in MRPC's layout (local GLUE TSV) learns it, and the exported
Hugging Face classifier (transformers' DebertaV2ForSequenceClassification: ContextPooler on the
first position, the classifier) gives our logits."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax import load_model  # noqa: E402
from heads_jax.model.deberta import DebertaForSequenceClassification  # noqa: E402
from heads_jax.training import configlib, finetune  # noqa: E402
from tests.model.test_deberta import save_deberta_dir  # noqa: E402
from tests.training.test_family_training import _mrpc_dir  # noqa: E402

pytestmark = pytest.mark.slow


def test_deberta_finetunes_on_mrpc_and_exports(tmp_path):
  model_dir = tmp_path / "deberta"
  _, tok = save_deberta_dir(model_dir, seed=7, hidden_size=64, intermediate_size=128)
  assert len(tok) > tok.vocab_size  # [MASK] added past the SentencePiece pieces
  glue = _mrpc_dir(tmp_path / "glue")
  overrides = [f"init_checkpoint={model_dir}", f"data.glue_dir={glue}", "data.train_split=train",
               "data.eval_split=dev", "data.holdout_fraction=0.0", "data.max_seq_length=32",
               "num_train_steps=40", "eval_every=20", "log_every=10", "checkpoint.every_steps=20",
               "optimizer.learning_rate=3e-2", "tensorboard=False", "batch_size=32"]
  c = configlib.load_config("configs/finetune.py:tiny_mrpc", overrides)
  s = finetune.train_and_evaluate(c, tmp_path / "run")
  assert s["best"]["accuracy"] >= 0.9, s["best"]
  model, tok = load_model(tmp_path / "run" / "best_model", head="auto")
  assert isinstance(model, DebertaForSequenceClassification) and model.config.family == "deberta-v2"
  hf = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / "run" / "best_hf"), attn_implementation="eager").eval()
  assert type(hf).__name__ == "DebertaV2ForSequenceClassification"
  enc = tok(["the movie was a", "a film"], ["it good great film", "it was awful and sad"],
            padding=True, return_tensors="np")
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(enc["input_ids"]),
             attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
  ours = np.asarray(model(enc["input_ids"], enc["attention_mask"])["logits"])
  np.testing.assert_allclose(ours, ref, atol=1e-4)
  assert (ours.argmax(-1) == [1, 0]).all()
