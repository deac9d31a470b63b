"""One check shared by the families' fine-tuning tests (issue 40 item 6): ``heads-jax finetune``'s
job on a tiny model directory and a separable synthetic pair task in MRPC's layout learns it, and
the exported Hugging Face classifier gives our logits."""

import numpy as np
import torch
import transformers

from heads_jax import load_model
from heads_jax.training import configlib, finetune
from tests.training.test_family_training import _mrpc_dir


def finetune_tiny_mrpc(model_dir, tmp_path) -> dict:
  """Fine-tunes ``model_dir`` on the synthetic MRPC task (40 LAMB steps, into ``tmp_path/run``);
  checks a best dev accuracy of at least 0.9 and returns the run's summary."""
  glue = _mrpc_dir(tmp_path / "glue")
  overrides = [f"init_checkpoint={model_dir}", f"data.glue_dir={glue}", "data.train_split=train",
               "data.eval_split=dev", "data.holdout_fraction=0.0", "data.max_seq_length=32",
               "num_train_steps=40", "eval_every=20", "log_every=10", "checkpoint.every_steps=20",
               "optimizer.learning_rate=3e-2", "tensorboard=False", "batch_size=32"]
  c = configlib.load_config("configs/finetune.py:tiny_mrpc", overrides)
  s = finetune.train_and_evaluate(c, tmp_path / "run")
  assert s["best"]["accuracy"] >= 0.9, s["best"]
  return s


def finetune_and_compare(model_dir, tmp_path, *, family: str, ours_class, hf_class_name: str):
  """Fine-tunes ``model_dir`` on the synthetic MRPC task (`finetune_tiny_mrpc`); checks the loaded
  best model's class and family, and its logits against transformers' ``hf_class_name`` (1e-4)."""
  finetune_tiny_mrpc(model_dir, tmp_path)
  model, tok = load_model(tmp_path / "run" / "best_model", head="auto")
  assert isinstance(model, ours_class) and model.config.family == family
  hf = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / "run" / "best_hf"), attn_implementation="eager").eval()
  assert type(hf).__name__ == hf_class_name
  enc = tok(["the movie was a", "a film"], ["it good great film", "it was awful and sad"],
            padding=True, return_tensors="np")
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(enc["input_ids"]),
             attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()
  ours = np.asarray(model(enc["input_ids"], enc["attention_mask"])["logits"])
  np.testing.assert_allclose(ours, ref, atol=1e-4)
  assert (ours.argmax(-1) == [1, 0]).all()
