"""Encoding examples into batches (DESIGN.md section 3 "Input encoding", heads_jax/data/vocabulary.py).

Expected values are written out by hand from the bert-base-uncased vocabulary, or checked
against independent references: plain-loop word/arc bookkeeping, the tokenizer's own per-word
tokenisation, and a re-implementation of longest-first truncation.
"""
import itertools

import numpy as np
import pytest
from spacy.tokens import Doc
from spacy.vocab import Vocab

from heads_jax.data import assets
from heads_jax.data import vocabulary as B
from heads_jax.data.conllu import read_conllu
from heads_jax.data.encoding import (AnalysisExample, Segment, align_pieces_to_words,
                                     bucket_lengths, collate, encode_batch, encode_examples,
                                     iter_batches, padded_length)
from heads_jax.data.glue import load_glue_tsv
from heads_jax.data.syntax import from_doc
from heads_jax.data.tokenizer import load_tokenizer

CLS, SEP, PAD = B.TOKEN_CLS, B.TOKEN_SEP, B.TOKEN_PAD


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(assets.vocab_path())


def tokens(tok, batch, i=0):
  n = batch["attention_mask"][i].sum()
  return tok.convert_ids_to_tokens(batch["input_ids"][i, :n].tolist())


def words_segment(words, heads=None, rels=None):
  return Segment(words=tuple(words), heads=None if heads is None else tuple(heads),
                 deprels=None if rels is None else tuple(rels))


def test_wordpieces_of_one_word_share_its_index(tok):
  seg = words_segment(["He", "was", "unaffable", "."], [2, 2, -1, 2], ["nsubj", "cop", "root", "punct"])
  b = encode_batch([AnalysisExample(seg)], tok, k=10)
  assert tokens(tok, b) == ["[CLS]", "he", "was", "una", "##ffa", "##ble", ".", "[SEP]"]
  np.testing.assert_array_equal(b["word_ids"][0], [-1, 0, 1, 2, 2, 2, 3, -1, -1, -1])
  np.testing.assert_array_equal(b["dep_head"][0], [-1, 2, 2, -1, -1, -1, 2, -1, -1, -1])
  np.testing.assert_array_equal(b["dep_rel"][0], [0, B.REL_NSUBJ, 0, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(b["token_class"][0], [CLS, 0, 0, 0, 0, 0, B.TOKEN_PERIOD, SEP, PAD, PAD])
  np.testing.assert_array_equal(b["attention_mask"][0], [1] * 8 + [0] * 2)
  np.testing.assert_array_equal(b["token_type_ids"][0], [0] * 10)
  assert b["input_ids"][0, 8:].tolist() == [0, 0]
  assert all(b[f].dtype == np.int32 and b[f].shape == (1, 10) for f in B.BATCH_FIELDS)


def letters(n, start=0):
  return [chr(ord("a") + start + i) for i in range(n)]  # single letters: one piece each


def hf_longest_first(n_a, n_b, budget):
  """The Hugging Face tokenizers rule, written out independently (lengths after truncation)."""
  if n_a + n_b <= budget:
    return n_a, n_b
  short, long_ = sorted((n_a, n_b))
  if short <= budget - short:  # the shorter one fits in half: keep it, cut the longer
    short_keep, long_keep = short, budget - short
  else:  # both cut to half, the longer one (B on a tie) keeps the odd position
    short_keep, long_keep = budget // 2, budget // 2 + budget % 2
  return (long_keep, short_keep) if n_a > n_b else (short_keep, long_keep)


@pytest.mark.parametrize("n_a, n_b, max_length, kept", [
    (10, 4, 12, (5, 4)),   # the shorter B fits in half of the 9 positions: A is cut to 5
    (6, 5, 10, (4, 3)),    # both longer than half of 7: 3 each, the longer A keeps the odd one
    (4, 4, 8, (2, 3)),     # tie: B keeps the odd position
    (3, 3, 9, (3, 3)),     # fits
])
def test_pair_truncation_longest_first(tok, n_a, n_b, max_length, kept):
  ex = AnalysisExample(words_segment(letters(n_a)), words_segment(letters(n_b, 10)))
  b = encode_batch([ex], tok, max_length=max_length)
  ka, kb = kept
  assert tokens(tok, b) == ["[CLS]"] + letters(ka) + ["[SEP]"] + letters(kb, 10) + ["[SEP]"]
  n = 3 + ka + kb
  np.testing.assert_array_equal(b["token_type_ids"][0, :n], [0] * (ka + 2) + [1] * (kb + 1))
  # B's words continue after all n_a words of A (counted before truncation).
  np.testing.assert_array_equal(b["word_ids"][0, :n],
                                [-1] + list(range(ka)) + [-1] + list(range(n_a, n_a + kb)) + [-1])
  np.testing.assert_array_equal(b["token_class"][0, :n],
                                [CLS] + [0] * ka + [SEP] + [0] * kb + [SEP])


@pytest.mark.slow
def test_pair_truncation_matches_reference_rule_on_all_small_lengths(tok):
  cases = list(itertools.product(range(0, 9), range(0, 9), range(4, 14)))
  examples = [AnalysisExample(words_segment(letters(a) or [""]), words_segment(letters(b, 10) or [""]))
              for a, b, _ in cases]
  for (a, b_len, m), ex in zip(cases, examples):
    row = encode_examples([ex], tok, max_length=m)[0]
    types = row["token_type_ids"]
    got = (int((types == 0).sum()) - 2, int((types == 1).sum()) - 1)
    assert got == hf_longest_first(a, b_len, m - 3), (a, b_len, m)


def test_single_truncation_and_short_sequences(tok):
  empty = AnalysisExample(Segment(text=""))
  one = AnalysisExample(Segment(text="hi"))
  pair_empty = AnalysisExample(Segment(text=""), Segment(text=""))
  long_ = AnalysisExample(words_segment(letters(10)))
  b = encode_batch([empty, one, pair_empty, long_], tok, max_length=6)
  np.testing.assert_array_equal(b["attention_mask"].sum(1), [2, 3, 3, 6])
  assert tokens(tok, b, 0) == ["[CLS]", "[SEP]"]
  assert tokens(tok, b, 1) == ["[CLS]", "hi", "[SEP]"]
  assert tokens(tok, b, 2) == ["[CLS]", "[SEP]", "[SEP]"]
  np.testing.assert_array_equal(b["token_type_ids"][2, :3], [0, 0, 1])
  assert tokens(tok, b, 3) == ["[CLS]", "a", "b", "c", "d", "[SEP]"]
  assert b["word_ids"][0, :2].tolist() == [-1, -1] and b["word_ids"][1, :3].tolist() == [-1, 0, -1]
  with pytest.raises(ValueError, match="max_length must be an integer >= 4"):
    encode_batch([one], tok, max_length=3)


def test_no_arcs(tok):
  b = encode_batch([AnalysisExample(Segment(text="Dogs, cats and birds.")),
                    AnalysisExample(words_segment(["Dogs", "bark"]))], tok)
  assert (b["dep_head"] == -1).all() and (b["dep_rel"] == B.REL_NONE).all()
  assert tokens(tok, b) == ["[CLS]", "dogs", ",", "cats", "and", "birds", ".", "[SEP]"]
  np.testing.assert_array_equal(b["token_class"][0], [CLS, 0, B.TOKEN_COMMA, 0, 0, 0, B.TOKEN_PERIOD, SEP])
  np.testing.assert_array_equal(b["word_ids"][0], [-1, 0, 1, 2, 3, 4, 5, -1])  # tokenizer words


def test_relation_labels_obj_is_dobj_subtypes_do_not_match(tok):
  rels = ["nsubj:pass", "nsubjpass", "obj", "dobj", "amod", "advmod", "nsubj", "det", "root"]
  seg = words_segment(letters(len(rels)), [8] * 8 + [-1], rels)
  b = encode_batch([AnalysisExample(seg)], tok)
  np.testing.assert_array_equal(b["dep_rel"][0, 1:10], [0, 0, B.REL_OBJ, B.REL_OBJ, B.REL_AMOD,
                                                       B.REL_ADVMOD, B.REL_NSUBJ, 0, 0])
  np.testing.assert_array_equal(b["dep_head"][0, 1:10], [8] * 8 + [-1])  # every arc has a head


def test_dep_head_minus_one_when_head_truncated(tok):
  # I(->running, nsubj) saw(root) dogs(->saw, obj) yesterday(->saw, advmod) running(->saw)
  seg = words_segment(["I", "saw", "dogs", "yesterday", "running"], [4, -1, 1, 1, 1],
                      ["nsubj", "root", "obj", "advmod", "xcomp"])
  b = encode_batch([AnalysisExample(seg)], tok, max_length=5)
  assert tokens(tok, b) == ["[CLS]", "i", "saw", "dogs", "[SEP]"]
  np.testing.assert_array_equal(b["dep_head"][0], [-1, -1, -1, 1, -1])
  np.testing.assert_array_equal(b["dep_rel"][0], [0, 0, 0, B.REL_OBJ, 0])  # no rel without a head


def test_pair_arcs_use_sequence_word_numbering(tok):
  a = words_segment(["Dogs", "bark"], [1, -1], ["nsubj", "root"])
  b_ = words_segment(["cats", "eat", "fish"], [1, -1, 1], ["nsubj", "root", "obj"])
  b = encode_batch([AnalysisExample(a, b_)], tok)
  assert tokens(tok, b) == ["[CLS]", "dogs", "bark", "[SEP]", "cats", "eat", "fish", "[SEP]"]
  np.testing.assert_array_equal(b["word_ids"][0], [-1, 0, 1, -1, 2, 3, 4, -1])
  np.testing.assert_array_equal(b["dep_head"][0], [-1, 1, -1, -1, 3, -1, 3, -1])
  np.testing.assert_array_equal(b["dep_rel"][0], [0, B.REL_NSUBJ, 0, 0, B.REL_NSUBJ, 0, B.REL_OBJ, 0])


def repeated_doc():
  # "The unaffable cat saw the unaffable cat." (repeated multi-piece and single-piece words)
  words = ["The", "unaffable", "cat", "saw", "the", "unaffable", "cat", "."]
  return Doc(Vocab(), words=words, heads=[2, 2, 3, 3, 6, 6, 3, 3],
             deps=["det", "amod", "nsubj", "ROOT", "det", "amod", "dobj", "punct"],
             spaces=[True] * 6 + [False, False])


def test_spacy_doc_aligned_by_character_offsets_with_repeated_words(tok):
  b = encode_batch([AnalysisExample(Segment.from_parse(from_doc(repeated_doc())))], tok)
  assert tokens(tok, b) == ["[CLS]", "the", "una", "##ffa", "##ble", "cat", "saw", "the", "una",
                            "##ffa", "##ble", "cat", ".", "[SEP]"]
  np.testing.assert_array_equal(b["word_ids"][0], [-1, 0, 1, 1, 1, 2, 3, 4, 5, 5, 5, 6, 7, -1])
  # The second "unaffable" / "cat" point to the second cat / saw; a first-occurrence lookup
  # would give them the first cat's word index and the first cat's nsubj arc.
  np.testing.assert_array_equal(b["dep_head"][0], [-1, 2, 2, 2, 2, 3, -1, 6, 6, 6, 6, 3, 3, -1])
  np.testing.assert_array_equal(b["dep_rel"][0], [0, 0, 3, 3, 3, 1, 0, 0, 3, 3, 3, 2, 0, 0])


def test_align_pieces_when_parser_and_wordpiece_split_differently():
  # text "don't go": parser words do(0,2) n't(2,5) go(6,8); pieces don(0,3) '(3,4) t(4,5) go(6,8)
  got = align_pieces_to_words([(0, 0), (0, 3), (3, 4), (4, 5), (6, 8), (0, 0)],
                              [(0, 2), (2, 5), (6, 8)])
  np.testing.assert_array_equal(got, [-1, 0, 1, 1, 2, -1])
  # a piece in a gap no word covers, and one overlapping only the next word
  np.testing.assert_array_equal(align_pieces_to_words([(3, 4), (3, 7)], [(0, 2), (5, 8)]), [-1, 1])


def test_real_ud_ewt_sentences_against_plain_loop_reference(tok):
  sentences = list(read_conllu(assets.ud_ewt_test_path(), max_examples=60))
  examples = [AnalysisExample(Segment.from_sentence(s)) for s in sentences]
  b = encode_batch(examples, tok, max_length=32)
  for i, s in enumerate(sentences):
    n = b["attention_mask"][i].sum()
    ref_pieces, ref_words = ["[CLS]"], [-1]
    for w, form in enumerate(s.forms):
      pieces = tok.tokenize(form)
      ref_pieces += pieces
      ref_words += [w] * len(pieces)
    ref_pieces, ref_words = ref_pieces[:31] + ["[SEP]"], ref_words[:31] + [-1]
    assert tokens(tok, b, i) == ref_pieces
    assert b["word_ids"][i, :n].tolist() == ref_words
    kept = set(ref_words) - {-1}
    for t in range(n):
      w = ref_words[t]
      head = s.heads[w] - 1 if w >= 0 else -1
      ok = head >= 0 and head in kept
      assert b["dep_head"][i, t] == (head if ok else -1)
      rel = {"nsubj": 1, "obj": 2, "amod": 3, "advmod": 4}.get(s.deprels[w] if w >= 0 else "", 0)
      assert b["dep_rel"][i, t] == (rel if ok else 0)


def whitespace_parser(text):
  """A stand-in parser: whitespace words, each headed by the next word (last is the root),
  all labelled nsubj."""
  words = text.split()
  spaces, pos = [], 0
  for w in words:
    pos = text.index(w, pos) + len(w)
    spaces.append(pos < len(text) and text[pos] == " ")
  n = len(words)
  return Doc(Vocab(), words=words, spaces=spaces, heads=[min(i + 1, n - 1) for i in range(n)],
             deps=["nsubj"] * (n - 1) + ["ROOT"])


def test_real_mrpc_pairs_aligned_and_same_ids_as_plain_tokenizer(tok):
  glue = load_glue_tsv(assets.glue_dir(), "mrpc", max_examples=20)
  parses = [(from_doc(whitespace_parser(e.text_a)), from_doc(whitespace_parser(e.text_b)))
            for e in glue]
  examples = [AnalysisExample(Segment.from_parse(pa), Segment.from_parse(pb)) for pa, pb in parses]
  b = encode_batch(examples, tok, max_length=48)
  plain = tok([p.text for p, _ in parses], [p.text for _, p in parses], truncation=True,
              max_length=48, padding="max_length", return_offsets_mapping=True)
  for i, (pa, pb) in enumerate(parses):
    n = b["attention_mask"][i].sum()
    assert b["input_ids"][i, :n].tolist() == plain["input_ids"][i][:n]
    assert b["token_type_ids"][i, :n].tolist() == plain["token_type_ids"][i][:n]
    seq = plain.encodings[i].sequence_ids
    kept_words = set(b["word_ids"][i, :n].tolist()) - {-1}
    for t in range(n):
      if seq[t] is None:
        assert b["word_ids"][i, t] == -1 and b["dep_head"][i, t] == -1
        continue
      parse, base = (pa, 0) if seq[t] == 0 else (pb, len(pa))
      w = b["word_ids"][i, t] - base
      start, end = plain["offset_mapping"][i][t]
      ws, we = parse.spans[w]
      assert ws <= start < we  # the piece lies in its word
      head = w + 1 + base if w + 1 < len(parse) else -1
      expected = head if head in kept_words else -1
      assert b["dep_head"][i, t] == expected
      assert b["dep_rel"][i, t] == (B.REL_NSUBJ if expected >= 0 else 0)


def test_buckets_and_collate():
  assert bucket_lengths(128) == (16, 32, 48, 64, 80, 96, 112, 128)
  assert bucket_lengths(40, 16) == (16, 32, 40)
  assert padded_length(17, bucket_lengths(128)) == 32 and padded_length(16, (16, 32)) == 16
  with pytest.raises(ValueError):
    padded_length(129, bucket_lengths(128))
  row = {f: np.arange(3, dtype=np.int32) for f in B.BATCH_FIELDS}
  batch = collate([row], 4, b=2)
  assert batch["input_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 0, 0]]
  assert batch["word_ids"].tolist() == [[0, 1, 2, -1], [-1] * 4]
  assert batch["token_class"][1].tolist() == [PAD] * 4


def test_iter_batches_streams_sorts_and_restores_order(tok):
  sentences = list(read_conllu(assets.ud_ewt_test_path(), max_examples=70))
  examples = [AnalysisExample(Segment.from_sentence(s)) for s in sentences]
  reference = encode_examples(examples, tok, max_length=64)
  consumed = []
  def stream():
    for ex in examples:
      consumed.append(ex)
      yield ex
  it = iter_batches(stream(), tok, max_length=64, batch_size=8, sort_window=20)
  first_idx, first = next(it)
  assert len(consumed) == 24  # lazily: one window (20 rounded up to whole batches of 8)
  seen = [first_idx]
  batches = [(first_idx, first)] + list(it)
  for idx, batch in batches:
    n = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] in bucket_lengths(64)
    assert batch["input_ids"].shape[1] == padded_length(n.max(), bucket_lengths(64))
    for row, j in enumerate(idx):
      for f in B.BATCH_FIELDS:
        np.testing.assert_array_equal(batch[f][row, :n[row]], reference[j][f])
    seen.append(idx)
  all_idx = np.concatenate([i for i, _ in batches])
  assert sorted(all_idx.tolist()) == list(range(70))
  lens = np.array([len(r["input_ids"]) for r in reference])
  window0 = np.concatenate([i for i, _ in batches[:3]])  # 24 examples = first window
  assert (np.diff(lens[window0]) <= 0).all()  # longest first inside a window


def test_iter_batches_in_order_and_filler_rows(tok):
  examples = [AnalysisExample(words_segment(letters(i % 5 + 1))) for i in range(10)]
  out = list(iter_batches(examples, tok, batch_size=4, pad_to_batch_size=True))
  assert [i.tolist() for i, _ in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]]
  last = out[-1][1]
  assert last["input_ids"].shape == (4, 16) and (last["attention_mask"][2:] == 0).all()
  assert (last["token_class"][2:] == PAD).all()
  plain = list(iter_batches(examples, tok, batch_size=4))
  assert plain[-1][0].tolist() == [8, 9] and plain[-1][1]["input_ids"].shape == (2, 16)
