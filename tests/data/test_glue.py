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
  assert set(TASKS) == {"mrpc", "qqp", "sst2", "qnli", "mnli", "rte", "cola", "stsb", "wnli"}
  assert TASKS["mrpc"].metrics == ("accuracy", "f1") and TASKS["qqp"]["metrics"] == ("accuracy", "f1")
  assert TASKS["sst2"].metrics == ("accuracy",) and TASKS["qnli"].num_labels == 2
  assert TASKS["qnli"].label_names == ("entailment", "not_entailment")
  assert TASKS["sst2"].text_keys == ("sentence",) and not TASKS["sst2"].is_pair
  assert TASKS["qqp"].text_keys == ("question1", "question2") and TASKS["qqp"].is_pair
  assert task_info("SST-2") is TASKS["sst2"]
  with pytest.raises(ValueError, match="unknown GLUE task 'ax'"):
    task_info("ax")
  # the added tasks: TFDS glue/<task> label names and metrics
  assert TASKS["mnli"].label_names == ("entailment", "neutral", "contradiction")
  assert TASKS["mnli"].num_labels == 3 and TASKS["mnli"].text_keys == ("premise", "hypothesis")
  assert TASKS["rte"].label_names == ("entailment", "not_entailment")
  assert TASKS["wnli"].label_names == ("not_entailment", "entailment")
  assert TASKS["cola"].label_names == ("unacceptable", "acceptable") and not TASKS["cola"].is_pair
  assert TASKS["cola"].metrics == ("accuracy", "matthews")
  assert TASKS["stsb"].is_regression and TASKS["stsb"].num_labels == 1
  assert TASKS["stsb"].metrics == ("pearson", "spearman")
  assert task_info("STS-B") is TASKS["stsb"] and task_info("CoLA") is TASKS["cola"]
  assert not any(TASKS[t].is_regression for t in TASKS if t != "stsb")


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


# ---- MNLI, RTE, CoLA, STS-B, WNLI ---------------------------------------------------------------

@requires_shared("glue")
def test_shared_cola_has_no_header_except_its_test_split():
  dev = load_glue_tsv(SHARED_GLUE, "cola", "dev")
  # SOURCES.md: 1,043 rows, no header line; 721 acceptable (label 1) is GLUE's CoLA dev
  assert (len(dev), sum(e.label for e in dev)) == (1043, 721)
  assert dev[0] == GlueExample("The sailors rode the breeze clear of the rocks.", None, 1, 0)
  assert dev[-1] == GlueExample("John talked to Bill about himself.", None, 1, 1042)
  assert len(load_glue_tsv(SHARED_GLUE, "cola", "train")) == 8551
  test = load_glue_tsv(SHARED_GLUE, "cola", "test", max_examples=2)
  assert test[0] == GlueExample("Bill whistled past the house.", None, None, 0)


def test_cola_headerless_bad_row_named_by_its_line(tmp_path):
  d = tmp_path / "CoLA"
  d.mkdir()
  (d / "dev.tsv").write_text("gj04\t1\t\tA good one.\ngj04\t0\t*\n gj04\t0\t*\tBad one a.\n")
  with pytest.raises(ValueError, match=r"dev.tsv, line 2: expected 4 tab-separated fields, found 3"):
    load_glue_tsv(tmp_path, "cola", "dev", bad_rows="error")
  ex = load_glue_tsv(tmp_path, "cola", "dev", bad_rows="skip")
  assert ex == [GlueExample("A good one.", None, 1, 0), GlueExample("Bad one a.", None, 0, 2)]


@requires_shared("glue")
def test_shared_rte_wnli_stsb():
  rte = load_glue_tsv(SHARED_GLUE, "rte", "dev")
  assert (len(rte), sum(e.label for e in rte)) == (277, 131)  # not_entailment = 1
  assert rte[0].label == 1 and rte[0].text_b == "Christopher Reeve had an accident."
  wnli = load_glue_tsv(SHARED_GLUE, "wnli", "dev")
  assert (len(wnli), sum(e.label for e in wnli)) == (71, 31)  # entailment = 1
  assert wnli[0] == GlueExample("The drain is clogged with hair. It has to be cleaned.",
                                "The hair has to be cleaned.", 0, 0)
  sts = load_glue_tsv(SHARED_GLUE, "sts-b", "dev")
  assert len(sts) == 1500 and all(isinstance(e.label, float) and 0 <= e.label <= 5 for e in sts)
  assert sts[0] == GlueExample("A man with a hard hat is dancing.",
                               "A man wearing a hard hat is dancing.", 5.0, 0)
  assert sts[1].label == 4.75
  assert load_glue_tsv(SHARED_GLUE, "stsb", "test", max_examples=1)[0].label is None
  from heads_jax.data.specs import load_spec
  ds = load_spec(f"glue-tsv:{SHARED_GLUE}/STS-B", max_examples=3)
  assert ds.spec.task == "stsb" and ds.pairs and ds.labels == [5.0, 4.75, 5.0]
  ds = load_spec(f"glue-tsv:{SHARED_GLUE}/CoLA:train", max_examples=2)
  assert ds.spec.task == "cola" and not ds.pairs and len(ds) == 2


MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
             "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")


def _mnli_dir(root):
  """A GLUE MNLI folder in GLUE's TSV layout: dev sets with label1..label5 and gold_label, train
  with label1 and gold_label, test without labels."""
  d = root / "MNLI"
  d.mkdir(parents=True)
  parse = "( x )\t( y )\t(ROOT x)\t(ROOT y)"
  dev = MNLI_HEAD + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
  (d / "dev_matched.tsv").write_text(
      dev + f"0\t1\t1e\tfiction\t{parse}\tA man sleeps.\tA person rests.\tentailment\tentailment"
      "\tneutral\tentailment\tentailment\tentailment\n"
      f"1\t2\t2c\tgovernment\t{parse}\tIt rains.\tIt is dry.\tcontradiction\tcontradiction"
      "\tcontradiction\tcontradiction\tcontradiction\tcontradiction\n")
  (d / "dev_mismatched.tsv").write_text(
      dev + f"0\t9\t9n\tletters\t{parse}\tShe wrote.\tShe wrote twice.\tneutral\tneutral"
      "\tneutral\tentailment\tneutral\tneutral\n")
  (d / "train.tsv").write_text(
      MNLI_HEAD + "\tlabel1\tgold_label\n"
      f"0\t3\t3n\ttelephone\t{parse}\tWe met.\tWe met on Monday.\tneutral\tneutral\n")
  (d / "test_matched.tsv").write_text(MNLI_HEAD + f"\n0\t4\t4\tslate\t{parse}\tP.\tH.\n")
  return d


def test_mnli_tsv_matched_and_mismatched(tmp_path):
  _mnli_dir(tmp_path)
  matched = [GlueExample("A man sleeps.", "A person rests.", 0, 0),
             GlueExample("It rains.", "It is dry.", 2, 1)]
  assert load_glue_tsv(tmp_path, "mnli", "dev") == matched  # dev means dev_matched
  assert load_glue_tsv(tmp_path, "mnli", "validation_matched") == matched
  assert load_glue_tsv(tmp_path, "mnli", "dev_mismatched") == [
      GlueExample("She wrote.", "She wrote twice.", 1, 0)]
  assert load_glue_tsv(tmp_path, "mnli", "train")[0].label == 1
  assert load_glue_tsv(tmp_path, "mnli", "test") == [GlueExample("P.", "H.", None, 0)]
  from heads_jax.data.specs import load_spec, parse_spec
  assert load_spec(f"glue-tsv:{tmp_path}/MNLI").examples == matched
  assert parse_spec(f"glue-tsv:{tmp_path}/MNLI:dev_mismatched").split == "dev_mismatched"
  with pytest.raises(ValueError, match="no test_mismatched.tsv"):
    parse_spec(f"glue-tsv:{tmp_path}/MNLI:test_mismatched")
  from heads_jax.data.glue_splits import load_task_splits
  train, ev, note = load_task_splits("mnli", glue_dir=tmp_path, eval_split="dev_mismatched")
  assert len(train) == 1 and ev[0].label == 1 and note["eval_split"] == "dev_mismatched"


def test_tfds_mnli_splits_and_stsb_scores(tmp_path):
  import numpy as np
  import tensorflow_datasets as tfds
  asked = []

  def source(*args, split=None, **kwargs):
    asked.append(str(split))
    if str(split).startswith("validation"):
      return [{"premise": "P", "hypothesis": b"H", "label": np.int64(2), "idx": np.int32(0)}]
    return [{"sentence1": "A", "sentence2": "B", "label": np.float32(3.8), "idx": 0},
            {"sentence1": "C", "sentence2": "D", "label": np.float32(-1.0), "idx": 1}]

  with tfds.testing.mock_data(as_data_source_fn=source, data_dir=str(tmp_path)):
    assert load_glue_tfds("mnli", "dev") == [GlueExample("P", "H", 2, 0)]
    load_glue_tfds("mnli", "dev_mismatched")
    load_glue_tfds("mnli", "validation_mismatched")
    sts = load_glue_tfds("stsb", "test")
  assert asked == ["validation_matched", "validation_mismatched", "validation_mismatched", "test"]
  assert sts[0].label == pytest.approx(3.8) and isinstance(sts[0].label, float)
  assert sts[1].label is None
  rec = {"sentence": "Him saw I.", "label": 0, "idx": 5}
  assert glue_example_from_record("cola", rec) == GlueExample("Him saw I.", None, 0, 5)
