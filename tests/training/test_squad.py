"""SQuAD fine-tuning: the span loss by hand, the window batches, the presets, and a tiny run
(random tiny model, a few steps, stopped and resumed) that writes predictions.json and EM/F1 and
exports a model that transformers' BertForQuestionAnswering reads with the same answers."""

import json

import numpy as np
import pytest

from heads_jax.data import squad as sq
from heads_jax.data import squad_eval
from heads_jax.errors import UserError
from heads_jax.training import configlib, finetune
from heads_jax.training import squad as sqt


class _Fixed:
  """A stand-in model returning fixed logits."""

  def __init__(self, start, end):
    self.start, self.end = start, end

  def __call__(self, ids, mask, types, deterministic=True):
    return {"start_logits": self.start, "end_logits": self.end}


def test_span_loss_by_hand():
  import jax.numpy as jnp
  start = jnp.array([[0.0, 0.0, 0.0, 0.0], [np.log(3.0), 0.0, 0.0, 0.0]])
  end = jnp.zeros((2, 4))
  batch = {"input_ids": None, "attention_mask": None, "token_type_ids": None,
           "start_positions": jnp.array([1, 0]), "end_positions": jnp.array([2, 3])}
  loss, m, logits = sqt.span_loss(_Fixed(start, end), batch, deterministic=True)
  # row 0: start and end uniform over 4: log 4 each; row 1: start p = 3/6 -> log 2, end log 4
  expect = (np.log(4) + 0.5 * (np.log(2) + np.log(4))) / 2
  assert float(loss) == pytest.approx(expect, rel=1e-6)
  assert logits.shape == (2, 4, 2) and float(m["start_accuracy"]) == 0.5
  batch["weights"] = jnp.array([0.0, 1.0])   # a padding row does not count
  assert float(sqt.span_loss(_Fixed(start, end), batch, deterministic=True)[0]) == pytest.approx(
      0.5 * (np.log(2) + np.log(4)), rel=1e-6)


def test_window_batches_cover_every_window_once():
  arrays = {k: np.arange(11 * 3).reshape(11, 3) for k in sqt.INPUTS}
  arrays.update(start_positions=np.arange(11), end_positions=np.arange(11))
  seen = []
  for batch, idx in sqt.window_batches(arrays, 4, 2):
    assert len(batch["input_ids"]) == 4 and (batch["attention_mask"][idx < 0] == 0).all()
    seen += idx[idx >= 0].tolist()
  assert seen == list(range(11))
  b = sqt.WindowBatches(arrays, 4, seed=0)
  epoch = np.concatenate([b.batch(s)["start_positions"] for s in range(3)])[:11]
  assert sorted(epoch.tolist()) == list(range(11)) and "labels" not in b.batch(0)


def test_presets():
  for name in ("squad", "cpu_squad", "tiny_squad"):
    c = configlib.load_config(f"configs/finetune.py:{name}", [])
    assert c.task == "squad" and c.optimizer.name == "lamb" and c.select_metric == "f1"
  c = configlib.load_config("configs/finetune.py:squad", [])
  assert (c.data.max_seq_length, c.squad.doc_stride, c.squad.max_query_length) == (384, 128, 64)
  assert (c.squad.n_best_size, c.squad.max_answer_length, c.squad.source) == (20, 30, "tfds")
  c.squad.source = "json"
  with pytest.raises(UserError, match="needs squad.train_file"):
    sqt.load_squad_splits(c)


CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito", "Delhi", "Tokyo", "Seoul", "Hanoi",
          "Dakar", "Accra"]


def _squad_file(path):
  """Three articles of capital-city questions, each context a few sentences long."""
  data = []
  for a in range(3):
    paras = []
    for p in range(4):
      cities = CITIES[(a * 4 + p) % 12:] + CITIES[:(a * 4 + p) % 12]
      sents = [f"The capital of land {c.lower()} is {c}." for c in cities[:3]]
      context = " ".join(sents) + " Many people live there and the weather is mild."
      qas = []
      for i, c in enumerate(cities[:3]):
        qas.append({"id": f"a{a}p{p}q{i}", "question": f"What is the capital of land {c.lower()}?",
                    "answers": [{"text": c, "answer_start": context.index(f"is {c}.") + 3}]})
      paras.append({"context": context, "qas": qas})
    data.append({"title": f"Article_{a}", "paragraphs": paras})
  path.write_text(json.dumps({"version": "1.1", "data": data}))
  return path


@pytest.mark.slow  # about 40 s of CPU (two runs, compiles and exports); minutes on a shared CPU
def test_tiny_finetune_writes_predictions_and_scores_and_resumes(tmp_path):
  f = _squad_file(tmp_path / "squad.json")
  over = [f"squad.train_file={f}", "squad.eval_titles=Article_2", "data.max_examples=0",
          "num_train_steps=4", "eval_every=2", "checkpoint.every_steps=2", "tensorboard=False",
          "data.max_seq_length=32", "squad.doc_stride=16", "squad.max_query_length=12"]
  work = tmp_path / "run"
  first = finetune.train_and_evaluate(configlib.load_config("configs/finetune.py:tiny_squad",
                                                            over + ["stop_at_step=2"]), work)
  assert first["final_step"] == 2 and not first["exports"]
  s = finetune.train_and_evaluate(configlib.load_config("configs/finetune.py:tiny_squad", over), work)
  assert s["start_step"] == 2 and s["origin"].startswith("resumed") and s["final_step"] == 4
  assert (s["data"]["num_train"], s["data"]["num_eval"]) == (24, 12)
  for step in (2, 4):
    d = work / "eval" / f"step_{step:07d}"
    preds = json.loads((d / "predictions.json").read_text())
    scores = json.loads((d / "eval.json").read_text())
    assert set(preds) == {f"a2p{p}q{i}" for p in range(4) for i in range(3)}
    refs = squad_eval.references_of(sq.read_squad_json(f)[24:])
    again = squad_eval.squad_scores(refs, preds)
    assert scores["exact_match"] == pytest.approx(again["exact_match"])
    assert scores["f1"] == pytest.approx(again["f1"]) and scores["step"] == step
  best = s["best"]
  assert best["predictions"].endswith(f"step_{best['step']:07d}/predictions.json")
  assert json.loads((work / "summary.json").read_text())["best"]["step"] == best["step"]

  # the exported model (Hugging Face) gives the best evaluation's answers in PyTorch
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from heads_jax import load_model
  model, tok = load_model(work / "best_model", head="auto")
  assert type(model).__name__ == "BertForQuestionAnswering"
  ev = sq.build_features(sq.read_squad_json(f)[24:], tok, max_seq_length=32, doc_stride=16,
                         max_query_length=12)
  hf = transformers.BertForQuestionAnswering.from_pretrained(str(work / "best_hf")).eval()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ev.input_ids, dtype=torch.long),
             attention_mask=torch.tensor(ev.attention_mask, dtype=torch.long),
             token_type_ids=torch.tensor(ev.token_type_ids, dtype=torch.long))
  ours = model(ev.input_ids, ev.attention_mask, ev.token_type_ids)
  np.testing.assert_allclose(np.asarray(ours["start_logits"]), out.start_logits.numpy(), atol=2e-4)
  start, end = out.start_logits.numpy(), out.end_logits.numpy()
  preds = squad_eval.predict_answers(ev, start, end)
  saved = json.loads(open(best["predictions"]).read())
  # the same answers wherever the best span wins by a margin float rounding cannot flip
  clear = 0
  for ei, e in enumerate(ev.examples):
    cands = sorted((c for i in np.flatnonzero(ev.example_index == ei)
                    for c in squad_eval.window_candidates(start[i], end[i], ev.offsets[i],
                                                          ev.max_context[i])), reverse=True)
    if len(cands) < 2 or cands[0][0] - cands[1][0] > 1e-3:
      clear += 1
      assert preds[e.qid] == saved[e.qid], e.qid
  assert clear >= 3


@pytest.mark.slow
def test_evaluate_model_writes_predictions_and_scores(tmp_path):
  from flax import nnx

  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.config import config_for
  from heads_jax.model.heads import BertForQuestionAnswering
  tok = load_tokenizer()
  f = _squad_file(tmp_path / "squad.json")
  examples = sq.read_squad_json(f)[:6]
  feats = sq.build_features(examples, tok, max_seq_length=32, doc_stride=16, max_query_length=12)
  model = BertForQuestionAnswering(config_for("tiny", vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  preds, scores = sqt.evaluate_model(model, feats, tmp_path / "ev", batch_size=4)
  assert json.loads((tmp_path / "ev" / "predictions.json").read_text()) == preds
  assert set(preds) == {e.qid for e in examples} and scores["total"] == 6
  out = model(feats.input_ids, feats.attention_mask, feats.token_type_ids)
  assert preds == squad_eval.predict_answers(feats, np.asarray(out["start_logits"]),
                                             np.asarray(out["end_logits"]))
  # a gate closing every head changes the logits, and the evaluation sees it
  gate = np.zeros((model.config.num_layers, model.config.num_heads), np.float32)
  closed = model(feats.input_ids, feats.attention_mask, feats.token_type_ids, head_gate=gate)
  assert not np.allclose(np.asarray(closed["start_logits"]), np.asarray(out["start_logits"]))
  p2, _ = sqt.evaluate_model(model, feats, batch_size=4, head_gate=gate)
  assert p2 == squad_eval.predict_answers(feats, np.asarray(closed["start_logits"]),
                                          np.asarray(closed["end_logits"]))
