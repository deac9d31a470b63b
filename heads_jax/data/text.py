"""Plain-text analysis inputs: one sentence per line, paragraphs, or a TSV of sentences / pairs."""

import csv
import dataclasses
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from heads_jax.data.utf8 import not_utf8


@dataclasses.dataclass(frozen=True)
class TextExample:
  """A single text (``text_b`` None) or a pair, with its 0-based position in the input."""
  text_a: str
  text_b: str | None = None
  idx: int = 0


def _check(path) -> Path:
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"text file {path} does not exist")
  return path


# Byte-order marks, longest first (UTF-32 LE starts with UTF-16 LE's).
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
         (b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def text_encoding(path) -> str:
  """The encoding to read a text file with: UTF-16 or UTF-32 when it starts with that byte-order
  mark (Windows editors write UTF-16 so), else UTF-8 (a UTF-8 mark skipped)."""
  with open(path, "rb") as f:
    head = f.read(4)
  for bom, encoding in _BOMS:
    if head.startswith(bom):
      return encoding
  return "utf-8-sig"


def _not_text(path, encoding: str):
  """The error for a file that failed to decode: as UTF-8, `not_utf8` (where and how to convert);
  as the UTF-16/32 its byte-order mark says, that it is not such text after all."""
  if encoding.startswith("utf-8"):
    return not_utf8(path)
  from heads_jax.errors import UserError
  name = encoding.upper()
  return UserError(f"{path}: starts with a {name} byte-order mark but is not {name} text; convert "
                   f"the file to UTF-8 (e.g. iconv -f {name} -t UTF-8 IN > OUT)")


def read_text(path, max_examples: int | None = None, unit: str = "line") -> Iterator[TextExample]:
  """Yields the texts of a UTF-8 file (or UTF-16/32 with its byte-order mark: `text_encoding`);
  blank lines are skipped, surrounding whitespace stripped. A file that is not UTF-8 raises a
  UserError naming the file and the line.

  ``unit="line"``: one example per non-blank line (one sentence per line).
  ``unit="paragraph"``: one example per block of non-blank lines (blank-line separated, as the
  Gutenberg books), its lines joined with single spaces.
  """
  if unit not in ("line", "paragraph"):
    raise ValueError(f"unit must be 'line' or 'paragraph', got {unit!r}")
  if max_examples is not None and max_examples <= 0:
    return
  count = 0
  encoding = text_encoding(_check(path))
  try:
    with open(path, encoding=encoding) as f:
      block = []
      for line in f:
        line = line.strip()
        if unit == "line":
          if line:
            yield TextExample(line, None, count)
            count += 1
        elif line:
          block.append(line)
          continue
        elif block:
          yield TextExample(" ".join(block), None, count)
          count += 1
          block = []
        if max_examples is not None and count >= max_examples:
          return
      if block:
        yield TextExample(" ".join(block), None, count)
  except UnicodeError:
    raise _not_text(path, encoding) from None


def load_text(path, max_examples: int | None = None, unit: str = "line") -> list[TextExample]:
  """All texts of a file as a list (see `read_text`)."""
  return list(read_text(path, max_examples, unit))


def load_tsv(path, header: bool = False, max_examples: int | None = None) -> list[TextExample]:
  """A TSV of single sentences (1 column) or sentence pairs (2 columns), no quoting; UTF-8, or
  UTF-16/32 with its byte-order mark.

  With ``header=True`` the first line is a header and is skipped. Every row must have the
  same number of columns (1 or 2); blank lines are skipped. A bad row raises ValueError with
  file and line, a file that is not UTF-8 a UserError with file and line.
  """
  csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
  encoding = text_encoding(_check(path))
  try:
    return _read_tsv(path, header, max_examples, encoding)
  except UnicodeError:
    raise _not_text(path, encoding) from None


def _read_tsv(path, header: bool, max_examples: int | None, encoding: str) -> list[TextExample]:
  examples, ncols = [], None
  with open(path, encoding=encoding, newline="") as f:
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    for lineno, row in enumerate(reader, 1):
      if header and lineno == 1:
        continue
      if not row or all(not c.strip() for c in row):
        continue
      if max_examples is not None and len(examples) >= max_examples:
        break
      if len(row) not in (1, 2):
        raise ValueError(f"{path}, line {lineno}: expected 1 (sentence) or 2 (sentence pair) "
                         f"tab-separated columns, found {len(row)}")
      if ncols is None:
        ncols = len(row)
      elif len(row) != ncols:
        raise ValueError(f"{path}, line {lineno}: found {len(row)} column(s) but earlier rows "
                         f"have {ncols}; every row must be a single sentence or every row a pair")
      examples.append(TextExample(row[0].strip(), row[1].strip() if ncols == 2 else None,
                                  len(examples)))
  return examples


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def label_column(examples: list[TextExample]) -> str | None:
  """The values of a pair TSV's second column when they look like class labels, not sentences
  (every value a number, or at most 3 distinct single words over 4+ rows: an SST-2 or CoLA
  file read as ``tsv:``), as text such as ``'0', '1'``; None otherwise."""
  second = [e.text_b for e in examples if e.text_b is not None]
  if not second or len(second) != len(examples):
    return None
  values = sorted(set(second))
  numeric = all(_NUMBER.fullmatch(v) for v in values)
  words = len(second) >= 4 and len(values) <= 3 and all(v and " " not in v for v in values)
  if not (numeric or words):
    return None
  shown = ", ".join(repr(v) for v in values[:5]) + (", ..." if len(values) > 5 else "")
  return shown
