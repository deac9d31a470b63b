"""CoNLL-U reader (gold dependency parses, e.g. UD English EWT), streaming.

Only syntactic words count: lines whose ID is an integer. Multiword-token lines (``1-2``) and
empty nodes (``8.1``) are skipped. HEAD is column 7 (0 = root, otherwise the 1-based ID of the
head word), DEPREL column 8 (UD labels with subtypes kept, e.g. ``nsubj:pass``).
"""

import dataclasses
import gzip
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from heads_jax.data.utf8 import not_utf8

NUM_COLUMNS = 10


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One CoNLL-U sentence, syntactic words only.

  ``heads[i]`` is the head of word i+1 in CoNLL-U numbering (0 = root, else 1..len(forms));
  ``text`` is the ``# text =`` comment, or else rebuilt from the forms and ``SpaceAfter=No``.
  """
  forms: tuple[str, ...]
  heads: tuple[int, ...]
  deprels: tuple[str, ...]
  text: str
  sent_id: str | None = None
  upos: tuple[str, ...] = ()

  def __len__(self) -> int:
    return len(self.forms)

  def head_indices(self) -> tuple[int, ...]:
    """Heads as 0-based word indices, -1 for the root(s)."""
    return tuple(h - 1 for h in self.heads)


def _open(path) -> TextIO:
  path = Path(path)
  if path.suffix == ".gz":
    return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig")
  return open(path, encoding="utf-8-sig")


def _error(name, lineno, what) -> ValueError:
  return ValueError(f"{name}, line {lineno}: malformed CoNLL-U: {what}")


def _rebuild_text(forms, misc) -> str:
  parts = []
  for form, m in zip(forms, misc):
    parts.append(form)
    if "SpaceAfter=No" not in m.split("|"):
      parts.append(" ")
  return "".join(parts).rstrip(" ")


def _check_tree(heads, linenos, name) -> None:
  """Gold arcs must form a tree: following HEAD from any word reaches the root (0); a cycle
  (word 1 -> 2 -> 1) is a ValueError naming the words and the line of the first."""
  n = len(heads)
  for start in range(1, n + 1):
    seen, w = [], start
    while w != 0 and w not in seen:
      seen.append(w)
      w = heads[w - 1]
    if w != 0:
      cycle = seen[seen.index(w):]
      raise _error(name, linenos[min(cycle) - 1],
                   f"the HEAD column makes a cycle ({' -> '.join(map(str, cycle + [w]))}): "
                   "gold arcs must form a tree whose words all lead to the root (HEAD 0)")


def _parse_lines(lines, name) -> Iterator[Sentence]:
  comments = {}
  words = []  # (lineno, id, form, head_str, deprel, upos, misc)
  def flush():
    forms = tuple(w[2] for w in words)
    n = len(forms)
    heads = []
    for i, (lineno, _, _, head_str, _, _, _) in enumerate(words):
      try:
        head = int(head_str)
      except ValueError:
        raise _error(name, lineno, f"HEAD (column 7) must be an integer, got {head_str!r}") from None
      if not 0 <= head <= n:
        raise _error(name, lineno, f"HEAD {head} is out of range: the sentence has {n} words "
                     f"(HEAD must be 0 for the root or a word ID 1..{n})")
      if head == i + 1:
        raise _error(name, lineno, f"word {head} is its own head")
      heads.append(head)
    _check_tree(heads, [w[0] for w in words], name)
    text = comments.get("text")
    if text is None:
      text = _rebuild_text(forms, [w[6] for w in words])
    return Sentence(forms=forms, heads=tuple(heads), deprels=tuple(w[4] for w in words), text=text,
                    sent_id=comments.get("sent_id"), upos=tuple(w[5] for w in words))

  lineno = 0
  for lineno, line in enumerate(lines, 1):
    line = line.rstrip("\r\n")
    if not line.strip():
      if words:  # a comment block without words (e.g. a trailing `# newdoc`) is ignored
        yield flush()
      words, comments = [], {}
      continue
    if line.startswith("#"):
      key, sep, value = line[1:].partition("=")
      if sep:
        comments.setdefault(key.strip(), value.strip())
      continue
    cols = line.split("\t")
    if len(cols) != NUM_COLUMNS:
      raise _error(name, lineno, f"expected {NUM_COLUMNS} tab-separated columns, found {len(cols)}")
    wid = cols[0]
    if "-" in wid or "." in wid:  # multiword token or empty node: not a syntactic word
      continue
    if not wid.isdigit():
      raise _error(name, lineno, f"ID (column 1) must be an integer, a range a-b or a decimal, "
                   f"got {wid!r}")
    if int(wid) != len(words) + 1:
      raise _error(name, lineno, f"word ID {wid} out of sequence: expected {len(words) + 1} "
                   "(is a blank line missing between sentences?)")
    words.append((lineno, wid, cols[1], cols[6], cols[7], cols[3], cols[9]))
  if words:
    yield flush()


def read_conllu(source, max_examples: int | None = None) -> Iterator[Sentence]:
  """Yields the sentences of a CoNLL-U file (path, ``.gz`` path, or open text stream).

  Raises ValueError naming the file and line for a malformed line: wrong number of columns,
  a non-integer ID or HEAD, a HEAD outside 0..n, word IDs out of sequence; a UserError naming
  the file and line for a file that is not UTF-8.
  """
  if max_examples is not None and max_examples <= 0:
    return
  if isinstance(source, (str, os.PathLike)):
    if not Path(source).exists():
      raise FileNotFoundError(f"CoNLL-U file {source} does not exist")
    name = str(source)
    f = _open(source)
  else:
    name = getattr(source, "name", "<stream>")
    f = None
  try:
    count = 0
    for sentence in _parse_lines(f if f is not None else source, name):
      yield sentence
      count += 1
      if max_examples is not None and count >= max_examples:
        return
  except UnicodeDecodeError:
    if f is None:
      raise
    raise not_utf8(source) from None
  finally:
    if f is not None:
      f.close()


def load_conllu(source, max_examples: int | None = None) -> list[Sentence]:
  """All sentences of a CoNLL-U file as a list (see `read_conllu`)."""
  return list(read_conllu(source, max_examples))
