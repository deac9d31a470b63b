"""Text files that are not UTF-8: the first bad byte is found by line and column."""

import gzip

import pytest

from heads_jax.data import conllu, utf8
from heads_jax.data.corpora import TextCorpus
from heads_jax.errors import UserError

TEXT = "ascii line\nünïcödé line\n".encode() + b"bad \xff here\nlast\n"


@pytest.mark.parametrize("chunk", [3, 7, 1 << 22])
def test_first_invalid_byte_at_any_chunk_size(tmp_path, monkeypatch, chunk):
  monkeypatch.setattr(utf8, "_CHUNK", chunk)  # chunks that cut multi-byte characters and lines
  path = tmp_path / "a.txt"
  path.write_bytes(TEXT)
  assert utf8.first_invalid_utf8(path) == (3, 5, 0xFF)
  path.write_bytes("ünïcödé\n".encode() * 50)
  assert utf8.first_invalid_utf8(path) is None


def test_gzip_and_conllu(tmp_path):
  path = tmp_path / "x.conllu.gz"
  with gzip.open(path, "wb") as f:
    f.write(b"# text = caf\xe9\n1\tcaf\xe9\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n")
  assert utf8.first_invalid_utf8(path) == (1, 13, 0xE9)
  with pytest.raises(UserError, match=r"x\.conllu\.gz, line 1 \(byte 0xe9 at column 13\): not UTF-8"):
    conllu.load_conllu(path)


def test_text_corpus_checks_every_file(tmp_path):
  (tmp_path / "a.txt").write_text("Fine text. More of it.\n")
  (tmp_path / "b.txt").write_bytes(b"Fine.\n\nNot \x80 fine.\n")
  with pytest.raises(UserError, match=r"b\.txt, line 3 \(byte 0x80 at column 5\)"):
    TextCorpus([tmp_path], layout="lines")


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"),
                                           ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_file_is_named_by_its_byte_order_mark(tmp_path, encoding, name):
  path = tmp_path / "parses.conllu"
  bom = {"utf-16-be": b"\xfe\xff"}.get(encoding, b"")
  path.write_bytes(bom + "1\tWörd\t_\n".encode(encoding))
  message = str(utf8.not_utf8(path))
  assert f"is {name} text (byte-order mark)" in message and f"iconv -f {name} -t UTF-8" in message
  assert "latin1" not in message
