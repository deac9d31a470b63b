"""SQuAD reading (JSON v1.1/v2.0 layouts, TFDS records), bad input, run_squad.py windows checked
by hand, the windowing round trip on the shared dev subset, every family's template, data specs."""

import json

import numpy as np
import pytest

from heads_jax.data import squad as sq
from heads_jax.data.specs import load_spec, parse_spec
from heads_jax.data.tokenizer import load_tokenizer
from heads_jax.errors import UserError
from tests.helpers import SHARED, requires_shared

SHARED_SQUAD = SHARED / "squad" / "dev-v2.0-first5.json"
CONTEXT = "The Normans gave their name to Normandy, a region in France. They were Norse raiders."


def _write(tmp_path, doc, name="s.json"):
  p = tmp_path / name
  p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
  return p


def _doc(qas, version="1.1", context=CONTEXT):
  return {"version": version, "data": [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]}


def _qa(qid, question, text, start=None):
  start = CONTEXT.index(text) if start is None else start
  return {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def test_v1_and_v2_layouts(tmp_path):
  p = _write(tmp_path, _doc([_qa("q1", "Where is Normandy?", "France")]))
  (ex,) = sq.read_squad_json(p)
  assert (ex.qid, ex.question, ex.title, ex.is_impossible) == ("q1", "Where is Normandy?", "T", False)
  assert ex.answers == (sq.Answer("France", CONTEXT.index("France")),)
  assert (ex.text_a, ex.text_b, ex.label) == (ex.question, CONTEXT, None)
  v2 = _doc([_qa("a", "Who?", "Norse raiders"),
             {"id": "b", "question": "When?", "answers": [], "is_impossible": True,
              "plausible_answers": [{"text": "France", "answer_start": 53}]}], version="v2.0")
  p2 = _write(tmp_path, v2, "v2.json")
  assert [(e.qid, e.is_impossible, len(e.answers)) for e in sq.read_squad_json(p2)] == [
      ("a", False, 1), ("b", True, 0)]
  assert [e.qid for e in sq.read_squad_json(p2, "v1")] == ["a"]   # v1: answerable only
  assert len(sq.read_squad_json(p2, "v2", max_examples=1)) == 1


@requires_shared("squad")
def test_shared_dev_subset_counts():
  ex = sq.read_squad_json(SHARED_SQUAD)
  assert len(ex) == 1407 and sum(e.is_impossible for e in ex) == 702   # SOURCES.md
  v1 = sq.read_squad_json(SHARED_SQUAD, "v1")
  assert len(v1) == 705 and all(e.answers for e in v1)
  assert v1[0].question == "In what country is Normandy located?" and v1[0].answers[0] == sq.Answer("France", 159)
  titles = [t for t in dict.fromkeys(e.title for e in v1)]
  assert titles == ["Normans", "Computational_complexity_theory", "Southern_California",
                    "Sky_(United_Kingdom)", "Victoria_(Australia)"]
  train, held = sq.split_by_title(v1, ["Victoria_(Australia)"])
  assert len(held) == 124 and len(train) == 581 and not {e.context for e in held} & {e.context for e in train}


@pytest.mark.parametrize("doc, message", [
    ("{not json", "is not SQuAD JSON \\(not JSON"),
    ({"version": "1.1", "articles": []}, "is not SQuAD JSON \\(no 'data' list\\)"),
    ({"data": [{"title": "T", "paragraphs": [{"qas": []}]}]}, "is not SQuAD JSON \\(missing or malformed 'context'\\)"),
    (_doc([_qa("q9", "Where?", "France", start=3)]),
     "question q9: answer 'France' does not match the context at its answer_start 3"),
    (_doc([{"id": "q8", "question": "?", "answers": []}]), "q8 has no answers and is not marked is_impossible"),
])
def test_bad_input_one_line(tmp_path, doc, message):
  with pytest.raises(UserError, match=message) as e:
    sq.read_squad_json(_write(tmp_path, doc))
  assert "\n" not in str(e.value)


def test_question_longer_than_the_window(tmp_path, tok):
  ex = sq.read_squad_json(_write(tmp_path, _doc([_qa("q1", "where " * 40, "France")])))
  with pytest.raises(UserError, match="question q1 has 20 pieces .* leaves no room for its context"):
    sq.build_features(ex, tok, max_seq_length=23, max_query_length=20)
  assert len(sq.build_features(ex, tok, max_seq_length=24, max_query_length=20)) > 1  # 1 piece each


def test_doc_windows_and_max_context_by_hand():
  # run_squad.py: windows of <= 4 pieces, each starting min(length, stride=3) after the last
  assert sq.doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
  assert sq.doc_windows(5, 4, 128) == [(0, 4), (4, 1)]
  assert sq.doc_windows(4, 4, 1) == [(0, 4)]
  spans = sq.doc_windows(10, 4, 3)
  # piece 3: window 0 scores min(3, 0) + 0.04, window 1 min(0, 3) + 0.04: a tie, the first wins
  assert [sq.is_max_context(spans, i, 3) for i in range(3)] == [True, False, False]
  # piece 4: only window 1 (min(1, 2) + 0.04) holds it... and window 1 beats nothing else
  assert [sq.is_max_context(spans, i, 4) for i in range(3)] == [False, True, False]
  assert [sq.is_max_context(spans, i, 8) for i in range(3)] == [False, False, True]


def test_features_template_labels_and_offsets(tmp_path, tok):
  ex = sq.read_squad_json(_write(tmp_path, _doc([_qa("q1", "Where is Normandy?", "France")])))
  f = sq.build_features(ex, tok, max_seq_length=12, doc_stride=3, max_query_length=8)
  q = tok("Where is Normandy?", add_special_tokens=False)["input_ids"]
  c = tok(CONTEXT, add_special_tokens=False, return_offsets_mapping=True)
  room = 12 - len(q) - 3
  assert f.input_ids.shape == (len(f), 12) and len(f) == len(sq.doc_windows(len(c["input_ids"]), room, 3))
  assert (f.example_index == 0).all()
  c0 = 1 + len(q) + 1
  for i, (start, length) in enumerate(sq.doc_windows(len(c["input_ids"]), room, 3)):
    row = f.input_ids[i, :c0 + length + 1].tolist()
    assert row == [tok.cls_token_id] + q + [tok.sep_token_id] + c["input_ids"][start:start + length] + [tok.sep_token_id]
    assert f.attention_mask[i].sum() == c0 + length + 1
    assert f.token_type_ids[i, :c0].tolist() == [0] * c0 and f.token_type_ids[i, c0:c0 + length + 1].all()
    assert (f.offsets[i, :c0] == -1).all() and (f.offsets[i, c0 + length:] == -1).all()
    np.testing.assert_array_equal(f.offsets[i, c0:c0 + length], c["offset_mapping"][start:start + length])
  # the answer "France" is one piece; windows holding it point at it, the others at position 0
  hit = [i for i in range(len(f)) if f.start_positions[i]]
  assert hit and all(f.start_positions[i] == f.end_positions[i] for i in hit)
  for i in range(len(f)):
    s = f.start_positions[i]
    if s:
      assert CONTEXT[f.offsets[i, s, 0]:f.offsets[i, s, 1]] == "France"
    else:
      assert f.end_positions[i] == 0
  # every context piece has its maximum context in exactly one window
  per_piece = {}
  for i in range(len(f)):
    for j in np.flatnonzero(f.max_context[i]):
      per_piece.setdefault(tuple(f.offsets[i, j]), []).append(i)
  assert len(per_piece) == len(c["input_ids"]) and all(len(v) == 1 for v in per_piece.values())


def _round_trip(examples, f):
  """For every reference answer: a window holding all its pieces, and the text its pieces'
  offsets give back. Returns (exact, contained-only) counts; fails on an answer not found."""
  exact = contained = 0
  windows = {}
  for i, ei in enumerate(f.example_index.tolist()):
    windows.setdefault(ei, []).append(i)
  for ei, e in enumerate(examples):
    for a in e.answers:
      found = None
      for i in windows[ei]:
        real = f.offsets[i, :, 0] >= 0
        hit = np.flatnonzero(real & (f.offsets[i, :, 1] > a.start) & (f.offsets[i, :, 0] < a.start + len(a.text)))
        covers = (hit.size and f.offsets[i, hit[0], 0] <= a.start
                  and f.offsets[i, hit[-1], 1] >= a.start + len(a.text))
        if covers:
          found = e.context[f.offsets[i, hit[0], 0]:f.offsets[i, hit[-1], 1]]
          break
      assert found is not None, (e.qid, a)
      assert a.text in found, (e.qid, a, found)
      exact += found == a.text
      contained += found != a.text
  return exact, contained


@requires_shared("squad")
@pytest.mark.parametrize("settings", [{}, {"max_seq_length": 96, "doc_stride": 32}])
def test_round_trip_every_answer_of_the_shared_file(tok, settings):
  examples = sq.read_squad_json(SHARED_SQUAD, "v2")
  f = sq.build_features(examples, tok, **settings)
  exact, contained = _round_trip(examples, f)
  # 1,958 reference answers (up to four per question); only answers cut inside a word come back
  # with the rest of it (e.g. "gold rush" of "gold rushes"), as in run_squad.py
  assert exact + contained == sum(len(e.answers) for e in examples)
  assert contained <= 0.01 * exact
  # training labels (first answer): a window with the whole answer gets its pieces
  labelled = {int(f.example_index[i]) for i in range(len(f)) if f.start_positions[i] > 0}
  assert labelled == {i for i, e in enumerate(examples) if e.answers}
  if settings:
    assert len(f) > 2 * len(examples)  # many windows per question


@requires_shared("squad")
@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "albert"])
def test_every_family_template_and_round_trip(tmp_path, family):
  from tests.family_models import build_tokenizer
  build_tokenizer(family).save_pretrained(tmp_path)
  tok = load_tokenizer(tmp_path)
  examples = sq.read_squad_json(SHARED_SQUAD, "v1")[:40]
  f = sq.build_features(examples, tok, max_seq_length=128, doc_stride=48)
  exact, contained = _round_trip(examples, f)
  assert exact >= 0.9 * (exact + contained)
  prefix, middle, suffix = sq.pair_template(tok)
  if family == "roberta" or family == "xlm-roberta":
    assert (prefix, middle, suffix) == ([tok.cls_token_id], [tok.sep_token_id] * 2, [tok.sep_token_id])
  else:
    assert (prefix, middle, suffix) == ([tok.cls_token_id], [tok.sep_token_id], [tok.sep_token_id])
  n = int(f.attention_mask[0].sum())
  assert f.input_ids[0, 0] == tok.cls_token_id and f.input_ids[0, n - 1] == tok.sep_token_id
  assert (f.input_ids[0, n:] == tok.pad_token_id).all()


def test_tfds_records_converted_and_checked(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  records = [{"id": b"q1", "title": b"T", "context": CONTEXT.encode(), "question": "Where?",
              "answers": {"text": [b"France", b"in France"], "answer_start": np.array([53, 50], np.int32)}},
             {"id": "q2", "title": "T", "context": CONTEXT, "question": "Who?", "is_impossible": True,
              "answers": {"text": [], "answer_start": np.array([], np.int32)}}]
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: records, data_dir=str(tmp_path)):
    ex = sq.read_squad_tfds("v2.0", "validation")
    assert len(sq.read_squad_tfds("v2.0", "validation", max_examples=1)) == 1
  assert ex[0] == sq.SquadExample("q1", "Where?", CONTEXT, (sq.Answer("France", 53), sq.Answer("in France", 50)), "T")
  assert ex[1].is_impossible and ex[1].answers == ()
  bad = [dict(records[0], answers={"text": [b"France"], "answer_start": np.array([7])})]
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: bad, data_dir=str(tmp_path)):
    with pytest.raises(UserError, match="TFDS squad/v1.1 validation: question q1: answer 'France' does not match"):
      sq.read_squad_tfds("v1.1", "dev")


def test_tfds_missing_dataset_error(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(UserError, match="cannot read TFDS squad/v1.1 .*squad:FILE"):
    sq.read_squad_tfds("v1.1", data_dir=tmp_path)


def test_sample_examples_seeded():
  items = list(range(50))
  a = sq.sample_examples(items, 10, seed=1)
  assert a == sq.sample_examples(items, 10, seed=1) and a == sorted(a) and len(set(a)) == 10
  assert a != sq.sample_examples(items, 10, seed=2)
  assert sq.sample_examples(items, 80) == items and sq.sample_examples(items, None) == items


@requires_shared("squad")
def test_data_specs():
  f = str(SHARED_SQUAD)
  d = parse_spec(f"squad:{f}:v1:n=100:seed=3")
  assert (d.kind, d.version, d.sample, d.seed) == ("squad", "v1", 100, 3)
  assert parse_spec(f"squad:{f}").version is None
  t = parse_spec("squad-tfds:v2.0:train:n=1000")
  assert (t.kind, t.version, t.split, t.sample, t.seed) == ("squad-tfds", "v2", "train", 1000, 0)
  assert (parse_spec("squad-tfds").version, parse_spec("squad-tfds").split) == ("v1", "validation")
  ds = load_spec(f"squad:{f}:v1:n=100:seed=3")
  assert len(ds) == 100 and ds.pairs and ds.labels is None
  again = load_spec(f"squad:{f}:v1:n=100:seed=3")
  assert [e.qid for e in ds.examples] == [e.qid for e in again.examples]
  assert len(load_spec(f"squad:{f}:v1:n=100:seed=3", max_examples=10)) == 10
  assert len(load_spec(f"squad:{f}:v2")) == 1407
  with pytest.raises(ValueError, match="does not exist"):
    parse_spec("squad:/no/such/file.json")


@requires_shared("squad")
def test_analysis_encodes_question_then_context(tok):
  from heads_jax.data.specs import encode_spec
  info, batches, n = encode_spec(f"squad:{SHARED_SQUAD}:v1:n=4:seed=1", tok, max_length=384,
                                 syntax=False)
  assert n == 4 and info.dataset.pairs
  (idx, b), = list(batches)
  ex = info.dataset.examples
  for row, i in enumerate(idx):
    q = tok(ex[i].question, add_special_tokens=False)["input_ids"]
    assert b["input_ids"][row, 1:1 + len(q)].tolist() == q     # the question first
    assert b["token_type_ids"][row, :len(q) + 2].sum() == 0 and b["token_type_ids"][row, len(q) + 2] == 1


@pytest.mark.parametrize("suffix,message", [
    (":n=abc", "'n=abc': n must be a whole number, e.g. n=1000"),
    (":v3", "SQuAD version 'v3' is not one of v1, v2"),
    (":seed=-1", "'seed=-1': seed must be 0 or more"),
    (":v1:n=0", "'n=0': n is the number of questions to sample and must be at least 1"),
    (":n=5:samples=0", "unknown option 'samples=0': a SQuAD spec takes n=N"),
    (":v1:v2", "the SQuAD version is given twice"),
])
def test_bad_spec_values_are_named_not_taken_for_the_file(tmp_path, suffix, message):
  f = _write(tmp_path, _doc([_qa("q1", "Where is Normandy?", "France")]))
  with pytest.raises(ValueError) as e:
    parse_spec(f"squad:{f}{suffix}")
  text = str(e.value)
  assert text.startswith(f"data spec 'squad:{f}{suffix}': {message}"), text
  assert "does not exist" not in text and "\n" not in text
  with pytest.raises(ValueError, match="SQuAD version 'v3' is not one of v1.1, v2.0"):
    parse_spec("squad-tfds:v3:train")
  with pytest.raises(ValueError, match="'n=-2': n is the number of questions"):
    parse_spec("squad-tfds:v2.0:train:n=-2")
  t = parse_spec("squad-tfds:v2.0:train:n=7:seed=3")
  assert (t.version, t.split, t.sample, t.seed) == ("v2", "train", 7, 3)
  d = parse_spec(f"squad:{f}:2.0:seed=4:n=2")  # options in any order
  assert (d.path, d.version, d.sample, d.seed) == (f, "v2", 2, 4)


def test_unanswerable_questions_left_out_by_v1_are_counted(tmp_path):
  none = {"id": "x", "question": "When?", "answers": [], "is_impossible": True}
  only = _write(tmp_path, _doc([none, dict(none, id="y")], version="v2.0"), "only.json")
  with pytest.raises(UserError) as e:
    load_spec(f"squad:{only}:v1")
  assert str(e.value) == (f"{only}: all 2 questions are unanswerable (SQuAD v2.0 is_impossible) "
                          f"and v1 keeps only answerable ones: read it as v2 (squad:FILE:v2, "
                          f"squad.version=v2)")
  assert len(load_spec(f"squad:{only}").examples) == 2  # the file's version: v2
  mixed = _write(tmp_path, _doc([_qa("a", "Who?", "Norse raiders"), none], version="v2.0"))
  ds = load_spec(f"squad:{mixed}:v1")
  assert [e.qid for e in ds.examples] == ["a"]
  assert ds.warnings == (f"squad:{mixed}:v1: read as v1: 1 of 2 questions (unanswerable, SQuAD "
                         f"v2.0) left out; :v2 keeps them",)
  assert load_spec(f"squad:{mixed}:v2").warnings == ()


@pytest.mark.parametrize("start", ["abc", None, 3.5, [1]])
def test_an_answer_start_that_is_no_offset_is_named(tmp_path, start):
  doc = _doc([{"id": "q7", "question": "Where?", "answers": [{"text": "France",
                                                                "answer_start": start}]}])
  with pytest.raises(UserError) as e:
    sq.read_squad_json(_write(tmp_path, doc))
  assert str(e.value) == (f"{tmp_path / 's.json'}: question q7: answer 'France' has answer_start "
                          f"{start!r}, not a character offset (a whole number); fix the file")
