"""GLUE fine-tuning: metrics, batching, holdout splits, and an end-to-end run on a separable
synthetic task read through mocked TFDS (resume, best checkpoint, exports)."""

import json

import numpy as np
import pytest

from heads_jax.data.glue import GlueExample
from heads_jax.data.glue_batches import (EpochBatches, classification_metrics, encode_labelled,
                                         eval_batches)
from heads_jax.errors import UserError
from heads_jax.training import configlib, finetune
from tests.helpers import SHARED, requires_shared


def test_classification_metrics_match_sklearn():
  sk = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(0)
  y = rng.integers(0, 2, 200)
  p = np.where(rng.random(200) < 0.7, y, 1 - y)
  m = classification_metrics(p, y)
  assert m["accuracy"] == pytest.approx(sk.accuracy_score(y, p))
  assert m["f1"] == pytest.approx(sk.f1_score(y, p))
  assert m["precision"] == pytest.approx(sk.precision_score(y, p))
  assert classification_metrics(np.zeros(4), np.zeros(4))["f1"] == 0.0


def test_epoch_batches_cover_each_epoch_once():
  arrays = {"labels": np.arange(10, dtype=np.int32), "input_ids": np.arange(20).reshape(10, 2)}
  b = EpochBatches(arrays, 4, seed=1)
  seen = np.concatenate([b.batch(s)["labels"] for s in range(5)])  # 20 rows = 2 epochs
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
  assert not np.array_equal(seen[:10], seen[10:])
  again = EpochBatches(arrays, 4, seed=1)
  np.testing.assert_array_equal(again.batch(3)["input_ids"], b.batch(3)["input_ids"])
  halves = [EpochBatches(arrays, 4, 1, p, 2).batch(3)["labels"] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves), b.batch(3)["labels"])
  it = b.iterate(2)
  np.testing.assert_array_equal(next(it)["labels"], b.batch(2)["labels"])


def test_eval_batches_cover_all_rows():
  arrays = {k: np.arange(13 * 3).reshape(13, 3) for k in ("input_ids", "attention_mask", "token_type_ids")}
  arrays["labels"] = np.arange(13)
  rows, weights = [], []
  for batch, idx in eval_batches(arrays, 8, 8):
    assert len(batch["labels"]) == 8
    assert (batch["attention_mask"][idx < 0] == 0).all()
    rows.append(idx)
    weights.append(batch["weights"])
  rows, weights = np.concatenate(rows), np.concatenate(weights)
  assert sorted(rows[rows >= 0]) == list(range(13)) and weights.sum() == 13


def _qnli_dir(tmp_path, n=50):
  d = tmp_path / "glue" / "QNLI"
  d.mkdir(parents=True)
  lines = ["index\tquestion\tsentence\tlabel"]
  for i in range(n):
    lines.append(f"{i}\tWhat is {i}?\tIt is {i}.\t{'entailment' if i % 2 else 'not_entailment'}")
  (d / "dev.tsv").write_text("\n".join(lines) + "\n")
  return tmp_path / "glue"


def test_missing_train_split_is_an_error_unless_a_fallback_is_named(tmp_path):
  root = _qnli_dir(tmp_path)
  c = configlib.load_config("configs/finetune.py:qnli", [f"data.glue_dir={root}"])
  with pytest.raises(UserError, match="no train split.*fallback_train_split=dev"):
    finetune.task_splits(c)
  c.data.fallback_train_split = "dev"
  train, ev, note = finetune.task_splits(c)
  assert (len(train), len(ev)) == (45, 5)
  assert note["train_split"] == "dev" and note["holdout_fraction"] == 0.1
  assert not {e.idx for e in train} & {e.idx for e in ev}
  train2, ev2, _ = finetune.task_splits(c)
  assert [e.idx for e in ev2] == [e.idx for e in ev] == note["eval_idx"]
  c.data.holdout_seed = 5
  assert [e.idx for e in finetune.task_splits(c)[1]] != note["eval_idx"]
  assert train[0].text_b is not None and {e.label for e in train} == {0, 1}


def test_encode_labelled_pairs(tmp_path):
  from heads_jax.data.tokenizer import load_tokenizer
  tok = load_tokenizer()
  ex = [GlueExample("a question here", "the answer " * 40, 1, 0), GlueExample("short", "pair", 0, 1)]
  enc = encode_labelled(ex, tok, 16)
  assert enc["input_ids"].shape == (2, 16) and enc["labels"].tolist() == [1, 0]
  assert enc["attention_mask"][0].all() and enc["attention_mask"][1].sum() == 5
  assert enc["token_type_ids"][1, :5].tolist() == [0, 0, 0, 1, 1]
  assert (enc["input_ids"][0] == tok.sep_token_id).sum() == 2  # longest-first truncation keeps both


POS = "good great happy fine nice love best wonderful".split()
NEG = "bad awful sad poor hate worst terrible ugly".split()
FILLER = "the movie was a and it film story".split()


def _records(n, seed):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    y = int(rng.integers(0, 2))
    words = list(rng.choice(FILLER, 6)) + list(rng.choice(POS if y else NEG, 3))
    rng.shuffle(words)
    out.append({"sentence": " ".join(words), "label": np.int64(y), "idx": np.int32(i)})
  return out


@pytest.mark.slow
def test_finetune_separable_task_through_mocked_tfds(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  splits = {"train": _records(320, 0), "validation": _records(96, 1)}

  def source(self, split, **kwargs):
    return splits[str(split)]

  overrides = ["data.source=tfds", "data.holdout_fraction=0.0", "data.train_split=train",
               "data.eval_split=validation", "data.max_seq_length=16", "num_train_steps=40",
               "eval_every=20", "log_every=10", "checkpoint.every_steps=10",
               "optimizer.learning_rate=3e-2", "tensorboard=False"]
  work = tmp_path / "run"
  with tfds.testing.mock_data(as_data_source_fn=source, data_dir=str(tmp_path / "tfds")):
    c = configlib.load_config("configs/finetune.py:tiny", overrides + ["stop_at_step=25"])
    first = finetune.train_and_evaluate(c, work)
    assert first["final_step"] == 25 and not first["exports"]
    c = configlib.load_config("configs/finetune.py:tiny", overrides)
    s = finetune.train_and_evaluate(c, work)
  assert s["start_step"] == 25 and s["origin"].startswith("resumed")
  assert s["data"]["num_train"] == 320 and s["data"]["num_eval"] == 96
  assert s["best"]["accuracy"] >= 0.95, s["best"]
  assert s["final_eval"]["accuracy"] >= 0.95
  summary = json.loads((work / "summary.json").read_text())
  assert summary["best"]["step"] == s["best"]["step"]

  # the exported best model gives the best evaluation's accuracy, in heads_jax and in PyTorch
  from heads_jax import load_model
  model, tok = load_model(work / "best_model", head="auto")
  assert model.num_labels == 2
  enc = encode_labelled(
      [GlueExample(r["sentence"], None, int(r["label"]), i) for i, r in enumerate(splits["validation"])],
      tok, 16)
  logits = np.asarray(model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])["logits"])
  acc = np.mean(logits.argmax(-1) == enc["labels"])
  assert acc == pytest.approx(s["best"]["accuracy"])
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertForSequenceClassification.from_pretrained(str(work / "best_hf"))
  hf.eval()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(enc["input_ids"], dtype=torch.long),
             attention_mask=torch.tensor(enc["attention_mask"], dtype=torch.long),
             token_type_ids=torch.tensor(enc["token_type_ids"], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(out, logits, atol=2e-4)
  assert hf.config.id2label[1] == "positive"


# ---- CoLA (Matthews), STS-B (regression) --------------------------------------------------------

def test_matthews_pearson_spearman_hand_values():
  from heads_jax.data.glue_batches import matthews_corrcoef, pearson, spearman
  # tp 2, fp 1, tn 2, fn 0: (2*2 - 1*0) / sqrt(3 * 2 * 3 * 2) = 4 / 6
  assert matthews_corrcoef([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]) == pytest.approx(2 / 3)
  assert matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant predictions
  assert matthews_corrcoef([0, 1, 0], [1, 0, 1]) == pytest.approx(-1.0)
  # deviations (-1, 0, 1) and (-4/3, -1/3, 5/3): 3 / sqrt(2 * 14/3)
  assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / np.sqrt(28 / 3))
  # ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
  assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / np.sqrt(10))
  assert np.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_task_metrics_match_sklearn_and_scipy():
  sk = pytest.importorskip("sklearn.metrics")
  stats = pytest.importorskip("scipy.stats")
  from heads_jax.data.glue import TASKS
  from heads_jax.data.glue_batches import task_metrics
  rng = np.random.default_rng(1)
  y = rng.integers(0, 3, 300)
  p = np.where(rng.random(300) < 0.6, y, rng.integers(0, 3, 300))
  m = task_metrics(TASKS["cola"], p, y)
  assert m["matthews"] == pytest.approx(sk.matthews_corrcoef(y, p))
  assert m["accuracy"] == pytest.approx(sk.accuracy_score(y, p))
  assert "matthews" not in task_metrics(TASKS["mnli"], p, y)
  s = np.round(rng.uniform(0, 5, 300) * 4) / 4  # many ties, as STS-B's scores
  q = s + rng.normal(0, 1.5, 300)
  r = task_metrics(TASKS["stsb"], q, s)
  assert r["pearson"] == pytest.approx(stats.pearsonr(q, s)[0])
  assert r["spearman"] == pytest.approx(stats.spearmanr(q, s)[0])
  assert r["mse"] == pytest.approx(np.mean((q - s) ** 2))


def test_regression_loss_is_weighted_mse():
  import jax.numpy as jnp

  class Fake:
    def __call__(self, input_ids, attention_mask, token_type_ids, deterministic):
      return {"logits": jnp.asarray([[1.0], [2.5], [4.0]])}

  batch = {"input_ids": None, "attention_mask": None, "token_type_ids": None,
           "labels": jnp.asarray([2.0, 2.5, 0.0]), "weights": jnp.asarray([1.0, 1.0, 0.0])}
  loss, metrics, pred = finetune.regression_loss(Fake(), batch, deterministic=True)
  assert float(loss) == pytest.approx((1.0 + 0.0) / 2)  # the padding row (weight 0) ignored
  np.testing.assert_allclose(np.asarray(pred), [1.0, 2.5, 4.0])
  from heads_jax.data.glue import TASKS
  assert finetune.loss_of(TASKS["stsb"]) is finetune.regression_loss
  assert finetune.loss_of(TASKS["cola"]) is not finetune.regression_loss


def test_presets_of_the_added_tasks():
  for task in ("mnli", "rte", "cola", "stsb", "wnli"):
    for preset in (task, f"cpu_{task}", f"tiny_{task}"):
      assert configlib.load_config(f"configs/finetune.py:{preset}").task == task
  with pytest.raises(ValueError, match="unknown task in preset"):
    configlib.load_config("configs/finetune.py:cpu_ax")


@pytest.mark.slow
@requires_shared("glue")
def test_finetune_stsb_regression_exports_a_one_output_model(tmp_path):
  """STS-B end to end on a tiny random model: one output, Pearson/Spearman, and the exported
  model gives the same scores in heads_jax and in transformers (regression, ``num_labels=1``)."""
  overrides = ["data.max_examples=120", "data.max_seq_length=32", "num_train_steps=6",
               "eval_every=3", "log_every=3", "checkpoint.every_steps=3", "tensorboard=False",
               "batch_size=16"]
  c = configlib.load_config("configs/finetune.py:tiny_stsb", overrides)
  s = finetune.train_and_evaluate(c, tmp_path / "run")
  assert s["select_metric"] == "spearman" and s["final_step"] == 6
  assert set(s["final_eval"]) == {"pearson", "spearman", "loss", "step"}
  assert s["data"]["num_eval"] == 24  # holdout 0.2 of 120 dev rows
  from heads_jax import load_model
  from heads_jax.data.glue_batches import regression_metrics
  from heads_jax.data.glue_splits import select_rows
  from heads_jax.data.glue import load_glue_tsv
  model, tok = load_model(tmp_path / "run" / "best_model", head="auto")
  assert model.num_labels == 1
  ev = select_rows(load_glue_tsv(SHARED / "glue", "stsb", "dev", max_examples=120),
                   s["data"]["eval_idx"])
  enc = encode_labelled(ev, tok, 32)
  assert enc["labels"].dtype == np.float32
  pred = np.asarray(model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])["logits"])
  assert pred.shape == (24, 1)
  m = regression_metrics(pred[:, 0], enc["labels"])
  # Pearson's (continuous in the scores; a near-constant random model's ranks are not)
  assert m["pearson"] == pytest.approx(s["best"]["pearson"], abs=1e-4)
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "run" / "best_hf"))
  assert hf.config.num_labels == 1
  with torch.no_grad():
    out = hf(**{k: torch.tensor(enc[k], dtype=torch.long)
                for k in ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()
  np.testing.assert_allclose(out, pred, atol=2e-4)


@pytest.mark.parametrize("preset", ["cola", "mrpc,bs=128,lr=2e-4", "squad"])
def test_a_paper_preset_without_init_checkpoint_refuses_random_weights(preset, monkeypatch, tmp_path):
  from heads_jax.training import job as job_lib

  class Started(Exception):
    pass

  def started(*a, **k):
    raise Started

  monkeypatch.setattr(job_lib.TrainingJob, "__init__", started)
  monkeypatch.setattr(finetune, "TrainingJob", job_lib.TrainingJob)
  from heads_jax.training import squad as squad_training
  monkeypatch.setattr(squad_training, "TrainingJob", job_lib.TrainingJob)
  c = configlib.load_config(f"configs/finetune.py:{preset}")
  name = preset.split(",")[0]
  with pytest.raises(UserError) as e:
    finetune.train_and_evaluate(c, tmp_path / "run")
  assert str(e.value) == (
      f"the {name} preset fine-tunes a pre-trained BERT, but no init_checkpoint is given: pass "
      f"--config.init_checkpoint=DIR (a Hugging Face BERT folder such as bert-base-uncased, a "
      f"heads_jax model or a pre-training run's checkpoints), or --config.from_scratch=true to "
      f"fine-tune a randomly initialised base model on purpose")
  assert not (tmp_path / "run").exists()
  c.from_scratch = True  # asked for: it starts
  with pytest.raises(Started):
    finetune.train_and_evaluate(c, tmp_path / "run")
  for ok in ("tiny_cola", "tiny"):  # the tiny presets train from random weights as they say
    with pytest.raises(Started):
      finetune.train_and_evaluate(configlib.load_config(f"configs/finetune.py:{ok}"),
                                  tmp_path / "run")
  with pytest.raises(UserError, match="the cpu_cola preset fine-tunes a pretrained model"):
    finetune.train_and_evaluate(configlib.load_config("configs/finetune.py:cpu_cola"),
                                tmp_path / "run")
