"""GLUE loaders: TSV layouts (BOM, quotes, string labels, test splits, bad rows) and TFDS mock data."""
import warnings
from pathlib import Path

import pytest

from heads_jax.data import assets
from heads_jax.data.glue import (TASKS, GlueExample, glue_example_from_record, load_glue_tfds,
                                 load_glue_tsv, task_info, tsv_path)
from tests.helpers import SHARED, requires_shared

GLUE = Path(__file__).resolve().parents[1] / "fixtures" / "glue"
SHARED_GLUE = SHARED / "glue"


def test_task_metadata():
  assert set(TASKS) == {"mrpc", "qqp", "sst2", "qnli"}
  assert TASKS["mrpc"].metrics == ("accuracy", "f1") and TASKS["qqp"]["metrics"] == ("accuracy", "f1")
  assert TASKS["sst2"].metrics == ("accuracy",) and TASKS["qnli"].num_labels == 2
  assert TASKS["qnli"].label_names == ("entailment", "not_entailment")
  assert TASKS["sst2"].text_keys == ("sentence",) and not TASKS["sst2"].is_pair
  assert TASKS["qqp"].text_keys == ("question1", "question2") and TASKS["qqp"].is_pair
  assert task_info("SST-2") is TASKS["sst2"]
  with pytest.raises(ValueError, match="unknown GLUE task 'cola'"):
    task_info("cola")


def test_mrpc_bom_and_quotes():
  ex = load_glue_tsv(GLUE, "mrpc", "dev")
  assert ex[0] == GlueExample("He said the pie business doesn 't fit .",
                              '" The pie business does not fit our strategy .', 1, 0)
  assert ex[1].text_a == 'His wife said he was " 100 percent behind " him .' and ex[1].label == 0
  assert ex[1].idx == 1


def test_mrpc_test_split_has_no_labels_and_task_folder_works():
  ex = load_glue_tsv(GLUE / "MRPC", "mrpc", "test")
  assert ex == [GlueExample("PCCW 's chief will report to Mr So .", "The chief will report to So .",
                            None, 0)]


def test_qnli_string_labels_like_tfds():
  ex = load_glue_tsv(GLUE, "qnli", "validation")
  assert [e.label for e in ex] == [0, 1, 0]  # entailment=0, not_entailment=1
  assert ex[2].text_a == 'Who wrote "Hamlet"?' and ex[2].text_b == 'Shakespeare wrote "Hamlet".'


def test_sst2_single_sentences_with_quotes():
  ex = load_glue_tsv(GLUE, "sst-2", "dev")
  assert ex == [GlueExample("it 's a charming and often affecting journey . ", None, 1, 0),
                GlueExample('the " funny " parts are n\'t .', None, 0, 1)]


def test_bad_rows_warn_skip_or_error():
  with pytest.warns(UserWarning, match="skipped 1 malformed row.*line.* 2"):
    ex = load_glue_tsv(GLUE, "qqp", "train")
  assert [(e.idx, e.label) for e in ex] == [(1, 1), (2, 0)]  # idx = data row, as TFDS
  assert ex[1].text_a == 'How do I "learn" it?'
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert len(load_glue_tsv(GLUE, "qqp", "train", bad_rows="skip")) == 2
  with pytest.raises(ValueError, match=r"train.tsv, line 2: expected 6 tab-separated fields, found 5"):
    load_glue_tsv(GLUE, "qqp", "train", bad_rows="error")


def test_max_examples_and_missing_split():
  assert len(load_glue_tsv(GLUE, "qnli", "dev", max_examples=2)) == 2
  with pytest.raises(FileNotFoundError, match="no test.tsv for GLUE task qnli"):
    tsv_path(GLUE, "qnli", "test")


def test_embedded_dev_sets():
  mrpc = load_glue_tsv(assets.glue_dir(), "mrpc")
  sst2 = load_glue_tsv(assets.glue_dir(), "sst2")
  # Row and label counts from shared/data/SOURCES.md.
  assert (len(mrpc), sum(e.label for e in mrpc)) == (408, 279)
  assert (len(sst2), sum(e.label for e in sst2)) == (872, 444)
  assert all(e.text_b for e in mrpc) and all(e.text_b is None for e in sst2)


@requires_shared("glue")
def test_shared_qnli_dev_and_qqp_subset():
  qnli = load_glue_tsv(SHARED_GLUE, "qnli", "dev")
  assert (len(qnli), sum(e.label == 0 for e in qnli)) == (5463, 2702)  # entailment = 0
  assert load_glue_tsv(SHARED_GLUE, "qnli", "test", max_examples=3)[0].label is None
  with pytest.warns(UserWarning, match="skipped 1 malformed"):
    qqp = load_glue_tsv(SHARED_GLUE, "qqp", "train_subset")
  assert len(qqp) == 23496  # 23,497 rows, one malformed (SOURCES.md)
  assert sum(e.label for e in qqp) == 8747


@pytest.mark.parametrize("task", ["sst2", "mrpc"])
def test_tfds_mock_data(task, tmp_path):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=5, data_dir=str(tmp_path)):
    ex = load_glue_tfds(task, "validation")
    assert len(load_glue_tfds(task, "validation", max_examples=2)) == 2
  assert len(ex) == 5
  for e in ex:
    assert isinstance(e.text_a, str) and e.label in (0, 1) and isinstance(e.idx, int)
    assert (e.text_b is None) == (task == "sst2")


def test_tfds_records_converted_exactly(tmp_path):
  import numpy as np
  import tensorflow_datasets as tfds
  records = [{"sentence1": b"A caf\xc3\xa9 .", "sentence2": "B .", "label": np.int64(1),
              "idx": np.int32(7)},
             {"sentence1": "C", "sentence2": "D", "label": -1, "idx": 8}]
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: records, data_dir=str(tmp_path)):
    ex = load_glue_tfds("mrpc", "test")
  assert ex == [GlueExample("A café .", "B .", 1, 7), GlueExample("C", "D", None, 8)]
  qnli = glue_example_from_record("qnli", {"question": "Q?", "sentence": "S.", "label": 1, "idx": 0})
  assert qnli == GlueExample("Q?", "S.", 1, 0)


def test_tfds_missing_dataset_error(tmp_path):
  with pytest.raises(ValueError, match="cannot read TFDS glue/sst2.*glue-tsv"):
    load_glue_tfds("sst2", data_dir=tmp_path)
