"""BERT pre-training examples: sentence splitting, corpora, masking statistics, NSP, determinism."""

import re

import numpy as np
import pytest

from heads_jax.data.assets import gutenberg_paths
from heads_jax.data.corpora import MixtureCorpus, TextCorpus, TfdsCorpus, make_corpus
from heads_jax.data.pretraining import PretrainingExamples, PretrainingSpec
from heads_jax.data.sentences import chop_sentence, split_sentences
from heads_jax.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="module")
def books():
  return TextCorpus(gutenberg_paths())


def test_split_sentences():
  text = ('Mr. Woodhouse said "No." Then H. G. Wells left!  Is it 3?\n'
          'Yes. "Well," she said. St. Paul was there. e.g. lower case stays. End')
  assert split_sentences(text) == [
      'Mr. Woodhouse said "No."', "Then H. G. Wells left!", "Is it 3?", "Yes.",
      '"Well," she said.', "St. Paul was there. e.g. lower case stays.", "End"]
  assert split_sentences("  \n ") == []
  assert split_sentences("One line\nwrapped here. Next one.") == ["One line wrapped here.", "Next one."]


def test_text_corpus_layouts(tmp_path):
  book = tmp_path / "book.txt"
  book.write_text("First para line one\nline two.\n\nSecond para. Two sentences.\n")
  lines = tmp_path / "docs.txt"
  lines.write_text("Doc one s1.\nDoc one s2.\n\n\nDoc two s1.\n\nDoc three.\n")
  c = TextCorpus([book], layout="paragraphs")
  assert len(c) == 1 and c.length(0) == book.stat().st_size
  text, at_end = c.read(0, 0, 10**6)
  assert at_end and c.paragraphs(text) == ["First para line one\nline two.", "Second para. Two sentences.\n"]
  d = TextCorpus([lines], layout="lines")
  assert len(d) == 3
  texts = [d.read(i, 0, 10**6)[0] for i in range(3)]
  assert texts == ["Doc one s1.\nDoc one s2.\n", "Doc two s1.\n", "Doc three.\n"]
  assert d.paragraphs(texts[0]) == ["Doc one s1.", "Doc one s2."]
  assert [d.group(i) for i in range(3)] == [0, 1, 2]
  both = TextCorpus([book, lines], layout="paragraphs")
  assert [both.group(i) for i in range(2)] == [0, 1]
  with pytest.raises(FileNotFoundError):
    TextCorpus([tmp_path / "missing.txt"])
  with pytest.raises(ValueError, match="layout"):
    TextCorpus([book], layout="words")


def _check_layout(b, tok, spec):
  """Structural invariants of a collated batch; returns the original (unmasked) ids."""
  ids, mask, types = b["input_ids"], b["attention_mask"], b["token_type_ids"]
  orig = ids.copy()
  for r in range(len(ids)):
    n = int(mask[r].sum())
    assert n <= spec.max_seq_length and mask[r, :n].all() and not mask[r, n:].any()
    assert ids[r, 0] == tok.cls_token_id and ids[r, n - 1] == tok.sep_token_id
    seps = np.flatnonzero(ids[r, :n] == tok.sep_token_id)
    pos = b["masked_positions"][r][b["masked_weights"][r] > 0]
    orig[r, pos] = b["masked_ids"][r][b["masked_weights"][r] > 0]
    seps = np.flatnonzero(orig[r, :n] == tok.sep_token_id)
    assert len(seps) == 2, "exactly two [SEP] in the original sequence"
    assert (types[r, :seps[0] + 1] == 0).all() and (types[r, seps[0] + 1:n] == 1).all()
    assert not types[r, n:].any()
    assert seps[0] >= 2 and seps[1] - seps[0] >= 2, "both segments non-empty"
    # masked positions: sorted, unique, real, never [CLS]/[SEP]
    assert (np.diff(pos) > 0).all() and (pos > 0).all() and (pos < n).all()
    assert not np.isin(orig[r, pos], [tok.cls_token_id, tok.sep_token_id]).any()
    expected = min(spec.max_predictions, max(1, int(round(n * spec.masked_lm_prob))))
    assert len(pos) == expected
  return orig


def test_masking_and_nsp_statistics(tokenizer, books):
  spec = PretrainingSpec(max_seq_length=128, max_predictions=20)
  ex = PretrainingExamples(books, tokenizer, spec, seed=3)
  b = ex.batch(0, 400)
  orig = _check_layout(b, tokenizer, spec)
  w = b["masked_weights"] > 0
  rows = np.nonzero(w)[0]
  pos = b["masked_positions"][w]
  now = b["input_ids"][rows, pos]
  was = b["masked_ids"][w]
  n_masked = w.sum()
  non_special = (b["attention_mask"].sum() - 3 * len(orig))
  # 15% of the sequence length (special tokens included, as the recipe) -> ~15.4% of non-special
  assert 0.145 < n_masked / non_special < 0.16
  frac_mask = np.mean(now == tokenizer.mask_token_id)
  frac_kept = np.mean(now == was)
  frac_random = 1 - frac_mask - frac_kept
  # binomial standard deviations with ~7,000 predictions: 0.5% and 0.35%
  assert abs(frac_mask - 0.8) < 0.025
  assert abs(frac_kept - 0.1) < 0.02
  assert abs(frac_random - 0.1) < 0.02
  nsp = b["next_sentence_label"].mean()
  assert 0.42 < nsp < 0.62  # 50% plus single-sentence chunks, which are always random
  lengths = b["attention_mask"].sum(1)
  assert np.mean(lengths == 128) > 0.75 and np.mean(lengths < 100) > 0.03  # short_seq_prob 0.1


def _synthetic_books(tmp_path, n_files=6, n_sent=120):
  colors = ["red", "blue", "green", "black", "white", "brown"]
  for f in range(n_files):
    paras = []
    for p in range(0, n_sent, 5):
      paras.append(" ".join(f"{colors[f].capitalize()} {j}." for j in range(p, p + 5)))
    (tmp_path / f"book{f}.txt").write_text("\n\n".join(paras) + "\n")
  return colors[:n_files]


def test_next_sentence_semantics(tmp_path, tokenizer):
  colors = _synthetic_books(tmp_path)
  corpus = TextCorpus(sorted(tmp_path.glob("*.txt")))
  spec = PretrainingSpec(max_seq_length=32, max_predictions=5, short_seq_prob=0.0)
  ex = PretrainingExamples(corpus, tokenizer, spec, seed=0)
  b = ex.batch(0, 120)
  orig = _check_layout(b, tokenizer, spec)
  checked = {0: 0, 1: 0}
  for r in range(len(orig)):
    n = int(b["attention_mask"][r].sum())
    seps = np.flatnonzero(orig[r, :n] == tokenizer.sep_token_id)
    seg_a = tokenizer.decode(orig[r, 1:seps[0]])
    seg_b = tokenizer.decode(orig[r, seps[0] + 1:seps[1]])
    ca = set(re.findall(r"[a-z]+", seg_a)) & set(colors)
    cb = set(re.findall(r"[a-z]+", seg_b)) & set(colors)
    label = b["next_sentence_label"][r]
    if label == 1:
      assert ca.isdisjoint(cb), (seg_a, seg_b)  # random next comes from another book
    else:
      assert ca == cb and len(ca) == 1, (seg_a, seg_b)
      # B continues A: the numbers keep counting (truncation may cut the ends)
      na = [int(x) for x in re.findall(r"\d+", seg_a)]
      nb = [int(x) for x in re.findall(r"\d+", seg_b)]
      if na and nb:
        assert nb[0] > na[-1] and nb[0] - na[-1] <= 2
    checked[int(label)] += 1
  assert checked[0] > 20 and checked[1] > 20


def test_deterministic_and_sharded(tokenizer, books):
  spec = PretrainingSpec(max_seq_length=48, max_predictions=8)
  a = PretrainingExamples(books, tokenizer, spec, seed=7)
  b = PretrainingExamples(TextCorpus(gutenberg_paths()), tokenizer, spec, seed=7)
  c = PretrainingExamples(books, tokenizer, spec, seed=8)
  full = a.batch(5, 8)
  again = b.batch(5, 8)
  for k in full:
    np.testing.assert_array_equal(full[k], again[k])
  assert not np.array_equal(full["input_ids"], c.batch(5, 8)["input_ids"])
  # process shards: rows [p*B/P, (p+1)*B/P) of the global batch
  parts = [a.batch(5, 8, process_index=p, process_count=2) for p in range(2)]
  for k in full:
    np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), full[k])
  # batch N is examples N*B .. N*B+B-1: fast-forwarding is just starting at N
  it = a.batches(4, 8, prefetch=2, num_steps=2)
  got = list(it)
  assert len(got) == 2
  np.testing.assert_array_equal(got[1]["input_ids"], full["input_ids"])
  np.testing.assert_array_equal(got[0]["masked_ids"], a.batch(4, 8)["masked_ids"])
  with pytest.raises(ValueError, match="divisible"):
    a.batch(0, 5, process_count=2)


def test_whole_word_mask(tokenizer, books):
  spec = PretrainingSpec(max_seq_length=64, max_predictions=10, whole_word_mask=True)
  ex = PretrainingExamples(books, tokenizer, spec, seed=1)
  b = ex.batch(0, 64)
  _check_layout_ww = b["masked_weights"] > 0
  is_sub = np.array([t.startswith("##") for t in tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))])
  saw_piece = 0
  for r in range(len(b["input_ids"])):
    pos_arr = b["masked_positions"][r][_check_layout_ww[r]]
    orig = b["input_ids"][r].copy()
    orig[pos_arr] = b["masked_ids"][r][_check_layout_ww[r]]
    pos = set(pos_arr.tolist())
    n = int(b["attention_mask"][r].sum())
    for p in pos:  # a masked "##" piece implies its whole word is masked
      if is_sub[orig[p]]:
        saw_piece += 1
        assert p - 1 in pos or orig[p - 1] in (tokenizer.cls_token_id, tokenizer.sep_token_id)
      if p + 1 < n and is_sub[orig[p + 1]]:
        assert p + 1 in pos
  assert saw_piece > 0


def test_text_without_full_stops(tmp_path, tokenizer):
  """A document with no sentence ends is cut into pieces instead of read whole."""
  (tmp_path / "a.txt").write_text("word " * 100_000)
  (tmp_path / "b.txt").write_text("Other text. More of it here. " * 50)
  ex = PretrainingExamples(TextCorpus(tmp_path), tokenizer,
                           PretrainingSpec(max_seq_length=32, max_predictions=5), 0)
  b = ex.batch(0, 32)
  assert (b["attention_mask"].sum(1) > 5).all()
  pieces = chop_sentence("ab " * 1000, 100)
  assert max(map(len, pieces)) <= 100 and " ".join(pieces).split() == ["ab"] * 1000


def test_mixture_corpus(tmp_path, tokenizer):
  colors = _synthetic_books(tmp_path, n_files=2, n_sent=40)
  one = TextCorpus([tmp_path / "book0.txt"])
  two = TextCorpus([tmp_path / "book1.txt"])
  mix = MixtureCorpus([one, two], [0.25, 0.75])
  rng = np.random.default_rng(0)
  draws = np.array([mix.sample_document(rng) for _ in range(2000)])
  assert abs(np.mean(draws == 1) - 0.75) < 0.04
  assert mix.group(0) != mix.group(1)
  made = make_corpus(f"{tmp_path / 'book0.txt'};{tmp_path / 'book1.txt'}")
  assert isinstance(made, MixtureCorpus) and len(made) == 2
  ex = PretrainingExamples(mix, tokenizer, PretrainingSpec(max_seq_length=32, max_predictions=5), 0)
  b = ex.batch(0, 16)
  assert b["input_ids"].shape == (16, 32)
  with pytest.raises(ValueError, match="weights"):
    MixtureCorpus([one, two], [1.0])
  assert colors


def test_tfds_corpus_mocked(tokenizer, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  docs = [{"text": f"Article {i} starts here. It has a second sentence.\n\nA new paragraph {i} "
                   f"follows. And it ends.", "title": f"t{i}"} for i in range(12)]

  def source(self, split, **kwargs):
    return docs

  with tfds.testing.mock_data(as_data_source_fn=source, data_dir=str(tmp_path)):
    corpus = TfdsCorpus("wikipedia/20230601.en", "train")
    assert len(corpus) == 12
    ex = PretrainingExamples(corpus, tokenizer, PretrainingSpec(max_seq_length=32, max_predictions=5), 0)
    b = ex.batch(0, 16)
  _check_layout(b, tokenizer, ex.spec)
  text = tokenizer.decode(b["input_ids"][0])
  assert "article" in text or "paragraph" in text or "sentence" in text or "[MASK]" in text
  assert corpus.estimated_chars() > 12 * 50


def test_worker_processes_match_thread(tokenizer, books):
  spec = PretrainingSpec(max_seq_length=32, max_predictions=5)
  ex = PretrainingExamples(books, tokenizer, spec, seed=2)
  threaded = list(ex.batches(3, 4, num_steps=3))
  spawned = list(ex.batches(3, 4, num_steps=3, num_workers=2))
  for x, y in zip(threaded, spawned):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("sentence,types", [("Cat. ", 2), ("Cat dog. ", 3)])
def test_unigram_baseline_of_a_known_text(tmp_path, tokenizer, sentence, types):
  """A text of one repeated sentence of n equally frequent wordpieces has unigram entropy ln n:
  masked and randomly replaced wordpieces are counted as the originals, [CLS]/[SEP] not at all."""
  for i in range(2):
    (tmp_path / f"{i}.txt").write_text((sentence * 12 + "\n\n") * 20)
  ex = PretrainingExamples(TextCorpus(tmp_path), tokenizer,
                           PretrainingSpec(max_seq_length=32, max_predictions=5), 0)
  assert ex.unigram_entropy(200) == pytest.approx(np.log(types), abs=0.01)


def test_unigram_baseline_equals_a_count_over_the_batches(tokenizer, books):
  """The same figure counted from the collated batches the model sees (masks undone)."""
  ex = PretrainingExamples(books, tokenizer, PretrainingSpec(max_seq_length=64, max_predictions=10), 0)
  counts = np.zeros(len(tokenizer))
  for step in range(4):
    b = ex.batch(step, 32)
    ids = b["input_ids"].copy()
    for r in range(32):
      m = b["masked_weights"][r] > 0
      ids[r, b["masked_positions"][r, m]] = b["masked_ids"][r, m]
    keep = (b["attention_mask"] > 0) & ~np.isin(ids, [tokenizer.cls_token_id, tokenizer.sep_token_id])
    counts += np.bincount(ids[keep], minlength=len(counts))
  p = counts[counts > 0] / counts.sum()
  assert ex.unigram_entropy(128) == pytest.approx(-(p * np.log(p)).sum(), abs=1e-9)
