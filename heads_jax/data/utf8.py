"""UTF-8 text files: a file that is not UTF-8 is a ``UserError`` naming the file and the line.

Readers open text files with ``encoding="utf-8-sig"`` as usual and turn a
``UnicodeDecodeError`` into ``not_utf8(path)``, which scans the file again (only then) for the
first undecodable byte. ``check_utf8`` validates a whole file up front (a C-speed pass, chunks
cut at line ends), for readers that decode by byte ranges (the pre-training corpora).
"""

from __future__ import annotations

import gzip
from pathlib import Path

from heads_jax.errors import UserError

_CHUNK = 1 << 22  # bytes per decode call of check_utf8


def _open_binary(path):
  return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def first_invalid_utf8(path) -> tuple[int, int, int] | None:
  """``(line, column, byte)`` of the first byte of ``path`` that is not valid UTF-8 (line and
  byte column 1-based), or None when the whole file decodes. ``.gz`` files are decompressed."""
  lines_before = 0
  with _open_binary(path) as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        return None
      chunk += f.readline()  # end on a line end: no multi-byte character is cut
      try:
        chunk.decode("utf-8")
      except UnicodeDecodeError as e:
        line_start = chunk.rfind(b"\n", 0, e.start) + 1
        return (lines_before + chunk.count(b"\n", 0, e.start) + 1, e.start - line_start + 1,
                chunk[e.start])
      lines_before += chunk.count(b"\n")


# Byte-order marks of the other Unicode encodings (UTF-32 first: its LE mark starts like UTF-16's).
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
               (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def not_utf8(path) -> UserError:
  """The error for a text file that failed to decode as UTF-8 (says where and what to do): a file
  that starts with a UTF-16/32 byte-order mark is named as such, with the conversion from it."""
  with _open_binary(path) as f:
    head = f.read(4)
  for bom, name in _OTHER_BOMS:
    if head.startswith(bom):
      return UserError(f"{path} is {name} text (byte-order mark); convert it to UTF-8 "
                       f"(iconv -f {name} -t UTF-8 IN > OUT)")
  where = first_invalid_utf8(path)
  at = "" if where is None else f", line {where[0]} (byte 0x{where[2]:02x} at column {where[1]})"
  return UserError(f"{path}{at}: not UTF-8 text; convert the file to UTF-8 "
                   f"(e.g. iconv -f latin1 -t utf-8 IN > OUT)")


def check_utf8(path) -> None:
  """Raises ``not_utf8(path)`` unless the whole file is valid UTF-8."""
  if first_invalid_utf8(path) is not None:
    raise not_utf8(path)
