"""`heads-jax finetune` on ModernBERT (issue 40 item 6): a tiny random ModernBERT fine-tuned on a
separable synthetic pair task in MRPC's layout (local GLUE TSV) learns it, and the exported
Hugging Face classifier (transformers' ModernBertForSequenceClassification: the first position,
the prediction head, the classifier) gives our logits."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax.model.modernbert import ModernBertForSequenceClassification  # noqa: E402
from tests.family_models import save_family_dir  # noqa: E402
from tests.model.finetune_check import finetune_and_compare  # noqa: E402

pytestmark = pytest.mark.slow


def test_modernbert_finetunes_on_mrpc_and_exports(tmp_path):
  model_dir = tmp_path / "modernbert"
  save_family_dir("modernbert", model_dir, seed=7, hidden_size=64, intermediate_size=96)
  finetune_and_compare(model_dir, tmp_path, family="modernbert",
                       ours_class=ModernBertForSequenceClassification,
                       hf_class_name="ModernBertForSequenceClassification")
