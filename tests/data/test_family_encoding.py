"""Encoding with the tokenizers of other families (DESIGN.md section 3): template segments and
delimiters, the tokenizer's own special tokens, word alignment through offsets for byte-level BPE
(RoBERTa) and SentencePiece (XLM-RoBERTa, ALBERT)."""

import numpy as np
import pytest
from spacy.tokens import Doc
from spacy.vocab import Vocab

from heads_jax.data import assets
from heads_jax.data import vocabulary as B
from heads_jax.data.conllu import read_conllu
from heads_jax.data.encoding import (AnalysisExample, Segment, encode_batch, encode_texts,
                                     is_wordpiece, template_segments)
from heads_jax.data.syntax import from_doc
from heads_jax.data.tokenizer import load_tokenizer
from tests.family_models import build_tokenizer

SUBWORD = ("roberta", "xlm-roberta", "albert")
MARKS = "\u0120\u2581"  # byte-level BPE's and SentencePiece's word-boundary marks


@pytest.fixture(scope="module", params=SUBWORD)
def tok(request, tmp_path_factory):
  """The family's tokenizer, saved and read back through heads_jax's loader."""
  d = tmp_path_factory.mktemp(request.param)
  build_tokenizer(request.param).save_pretrained(d)
  loaded = load_tokenizer(d)
  loaded.family = request.param
  return loaded


def test_template_segments_by_hand():
  # BERT: [CLS] A A [SEP] B [SEP]
  assert template_segments([None, 0, 0, None, 1, None], True).tolist() == [0, 0, 0, 0, 1, 1]
  # RoBERTa: <s> A A </s> </s> B </s>: the first </s> after A is A's, the second is B's
  assert template_segments([None, 0, 0, None, None, 1, None], True).tolist() == [0, 0, 0, 0, 1, 1, 1]
  # empty A and empty B
  assert template_segments([None, None, None, None], True).tolist() == [0, 0, 1, 1]
  assert template_segments([None, 0, 0, None], False).tolist() == [0, 0, 0, 0]


def test_words_are_aligned_through_offsets(tok):
  """CoNLL-U words through a subword tokenizer: the pieces of each word spell that word (marks
  and, for the lower-casing ALBERT, case aside), word ids run 0, 1, ... in order, and every
  word before the truncation point has a piece."""
  assert not is_wordpiece(tok)
  sentences = list(read_conllu(assets.ud_ewt_test_path(), max_examples=40))
  b = encode_batch([AnalysisExample(Segment.from_sentence(s)) for s in sentences], tok, max_length=40)
  checked = 0
  for i, s in enumerate(sentences):
    n = int(b["attention_mask"][i].sum())
    pieces = tok.convert_ids_to_tokens(b["input_ids"][i, :n].tolist())
    words = b["word_ids"][i, :n]
    assert words[0] == -1 and words[n - 1] == -1
    inner = words[1:n - 1]
    assert inner.min() == 0 and np.all(np.diff(inner) >= 0) and np.all(np.diff(inner) <= 1)
    last = int(inner.max()) if n - 1 < 40 - 1 else int(inner.max()) - 1  # the last may be cut
    for w in range(last + 1):
      got = "".join(p for p, wid in zip(pieces, words) if wid == w)
      got = "".join(c for c in got if c not in MARKS)
      if tok.unk_token in got:
        continue
      form = s.forms[w]
      assert got == (form.lower() if tok.family == "albert" else form), (i, w, got, form)
      checked += 1
    # Arcs: a piece of word w points to the head word of w (when kept).
    for t in range(1, n - 1):
      head = s.heads[words[t]] - 1
      assert b["dep_head"][i, t] == (head if 0 <= head <= inner.max() else -1)
  assert checked > 300


def repeated_doc():
  words = ["The", "unaffable", "cat", "saw", "the", "unaffable", "cat", "."]
  return Doc(Vocab(), words=words, heads=[2, 2, 3, 3, 6, 6, 3, 3],
             deps=["det", "amod", "nsubj", "ROOT", "det", "amod", "dobj", "punct"],
             spaces=[True] * 6 + [False, False])


def test_parsed_text_with_repeated_words(tok):
  """Parser words by character span: the second "unaffable cat" gets the second cat's arcs."""
  b = encode_batch([AnalysisExample(Segment.from_parse(from_doc(repeated_doc())))], tok)
  n = int(b["attention_mask"][0].sum())
  pieces = tok.convert_ids_to_tokens(b["input_ids"][0, :n].tolist())
  words = b["word_ids"][0, :n].tolist()
  spelled = {}
  for p, w in zip(pieces, words):
    if w >= 0:
      spelled[w] = spelled.get(w, "") + "".join(c for c in p if c not in MARKS)
  expected = ["The", "unaffable", "cat", "saw", "the", "unaffable", "cat", "."]
  assert [spelled[w] for w in range(8)] == [e.lower() if tok.family == "albert" else e for e in expected]
  heads = {w: h for w, h in zip(words, b["dep_head"][0, :n].tolist()) if w >= 0}
  rels = {w: r for w, r in zip(words, b["dep_rel"][0, :n].tolist()) if w >= 0}
  assert heads == {0: 2, 1: 2, 2: 3, 3: -1, 4: 6, 5: 6, 6: 3, 7: 3}
  assert rels == {0: 0, 1: B.REL_AMOD, 2: B.REL_NSUBJ, 3: 0, 4: 0, 5: B.REL_AMOD, 6: B.REL_OBJ, 7: 0}


def test_pair_template_special_tokens_and_punctuation(tok):
  """The tokenizer's own start and separator tokens; commas and periods with or without the
  word-boundary mark."""
  ex = AnalysisExample(Segment.from_text("Red , green, blue."), Segment.from_text("Yes ."))
  b = encode_batch([ex], tok)
  n = int(b["attention_mask"][0].sum())
  pieces = tok.convert_ids_to_tokens(b["input_ids"][0, :n].tolist())
  cls = b["token_class"][0, :n].tolist()
  stripped = ["".join(c for c in p if c not in MARKS) for p in pieces]
  expected = [B.TOKEN_CLS if j == 0 else
              B.TOKEN_SEP if p == tok.sep_token else
              B.TOKEN_COMMA if s == "," else B.TOKEN_PERIOD if s == "." else B.TOKEN_OTHER
              for j, (p, s) in enumerate(zip(pieces, stripped))]
  assert cls == expected
  assert pieces[0] == tok.cls_token and cls.count(B.TOKEN_COMMA) == 2 and cls.count(B.TOKEN_PERIOD) == 2
  seps = [j for j, c in enumerate(cls) if c == B.TOKEN_SEP]
  assert len(seps) == (3 if tok.family != "albert" else 2)
  seg = b["token_type_ids"][0, :n].tolist()
  assert seg == [0] * (seps[0] + 1) + [1] * (n - seps[0] - 1)


def test_encode_texts_gives_segments_for_models(tok):
  """Fine-tuning inputs: the same segments as the analysis encoding, 0 on padding."""
  a, b = ["The cat sat.", "A much longer first sentence is here."], ["It sat.", "Short."]
  got = encode_texts(tok, a, b, max_length=24)
  assert got["input_ids"].shape == (2, 24)
  batch = encode_batch([AnalysisExample(Segment.from_text(x), Segment.from_text(y)) for x, y in zip(a, b)],
                       tok, max_length=24, k=24)
  real = got["attention_mask"] > 0
  np.testing.assert_array_equal(got["attention_mask"], batch["attention_mask"])
  np.testing.assert_array_equal(got["input_ids"][real], batch["input_ids"][real])
  np.testing.assert_array_equal(got["token_type_ids"], batch["token_type_ids"])
  assert got["token_type_ids"][0].max() == 1 and got["token_type_ids"][~real].max() == 0
