"""Sentence splitting for the pre-training examples (``heads_jax.data.pretraining``).

``split_sentences`` is a simple regular expression: a sentence ends at ``.``, ``!`` or ``?``
(optionally followed by closing quotes or brackets) followed by white space and an upper-case
letter, digit or opening quote; no split after common abbreviations ("Mr.", "Dr.", "St.", ...)
or single-letter initials ("H. G. Wells"). Paragraph breaks always end a sentence (callers split
paragraphs first). ``chop_sentence`` cuts an over-long "sentence" (text without full stops) at
spaces.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset("""
mr mrs ms dr st prof sr jr vs etc esq rev hon capt col gen gov lt sgt mt messrs mme mlle
vol ch fig cf al inc ltd co jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
_BOUNDARY = re.compile(r"""([.!?]+["'\u2019\u201d)\]]*)\s+(?=["'\u2018\u201c(\[_]*[A-Z0-9])""")
_LAST_WORD = re.compile(r"([A-Za-z]+)\.*$")


def split_sentences(paragraph: str) -> list[str]:
  """Splits one paragraph (any internal white space) into sentences; see the module docstring."""
  text = " ".join(paragraph.split())
  if not text:
    return []
  sentences, start = [], 0
  for m in _BOUNDARY.finditer(text):
    end = m.end(1)
    head = text[start:end]
    word = _LAST_WORD.search(head.rstrip("\"'\u2019\u201d)]!?"))
    if m.group(1).startswith(".") and word is not None:
      w = word.group(1)
      if w.lower() in _ABBREVIATIONS or (len(w) == 1 and w.isupper()):
        continue
    sentences.append(head)
    start = m.end()
  sentences.append(text[start:])
  return [s for s in sentences if s]


def chop_sentence(sentence: str, max_chars: int) -> list[str]:
  """A "sentence" longer than ``max_chars`` (text without full stops) cut at spaces into pieces;
  such a sentence would be truncated to the sequence length anyway."""
  if len(sentence) <= max_chars:
    return [sentence]
  pieces, start = [], 0
  while start < len(sentence):
    end = min(len(sentence), start + max_chars)
    if end < len(sentence):
      space = sentence.rfind(" ", start + 1, end)
      end = space if space > start else end
    pieces.append(sentence[start:end].strip())
    start = end
  return [p for p in pieces if p]
