"""`heads-jax finetune` on DeBERTa-v3 (issue 40 item 6): a tiny random DeBERTa-v3 directory as the
hub ships one (spm.model; the embedding table one row larger than the tokenizer's base vocabulary,
for the added [MASK], as deberta-v3-base's 128100 rows for 128001 pieces) fine-tuned on a
separable synthetic pair task in MRPC's layout (local GLUE TSV) learns it, and the exported
Hugging Face classifier (transformers' DebertaV2ForSequenceClassification: ContextPooler on the
first position, the classifier) gives our logits."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heads_jax.model.deberta import DebertaForSequenceClassification  # noqa: E402
from tests.model.test_deberta import save_deberta_dir  # noqa: E402
from tests.model.finetune_check import finetune_and_compare  # noqa: E402

pytestmark = pytest.mark.slow


def test_deberta_finetunes_on_mrpc_and_exports(tmp_path):
  model_dir = tmp_path / "deberta"
  _, tok = save_deberta_dir(model_dir, seed=7, hidden_size=64, intermediate_size=128)
  assert len(tok) > tok.vocab_size  # [MASK] added past the SentencePiece pieces
  finetune_and_compare(model_dir, tmp_path, family="deberta-v2",
                       ours_class=DebertaForSequenceClassification,
                       hf_class_name="DebertaV2ForSequenceClassification")
