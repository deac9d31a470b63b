"""Plain-text and TSV analysis inputs."""
from pathlib import Path

import pytest

from heads_jax.data import assets
from heads_jax.data.text import TextExample, load_text, load_tsv, read_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_lines_skip_blanks_and_strip():
  assert load_text(FIXTURES / "sentences.txt") == [
      TextExample("The cat sat.", None, 0), TextExample("The dog ran.", None, 1),
      TextExample("A bird sang.", None, 2)]
  assert [e.text_a for e in read_text(FIXTURES / "sentences.txt", max_examples=2)] == [
      "The cat sat.", "The dog ran."]


def test_paragraphs(tmp_path):
  path = tmp_path / "book.txt"
  path.write_text("First line\nof para one.\n\nPara two.\n\n\nPara\nthree\n")
  assert [e.text_a for e in load_text(path, unit="paragraph")] == [
      "First line of para one.", "Para two.", "Para three"]
  assert len(load_text(path, unit="paragraph", max_examples=2)) == 2
  with pytest.raises(ValueError, match="unit must be"):
    load_text(path, unit="word")


def test_embedded_book_paragraphs():
  paras = load_text(assets.gutenberg_paths()[0], unit="paragraph", max_examples=50)
  assert len(paras) == 50 and all(p.text_a and "\n" not in p.text_a for p in paras)


def test_tsv_pairs_with_header_and_quotes():
  ex = load_tsv(FIXTURES / "pairs.tsv", header=True)
  assert ex == [TextExample("The cat sat.", "A cat was sitting.", 0),
                TextExample('Dogs "bark".', "Dogs are loud.", 1)]
  no_header = load_tsv(FIXTURES / "pairs.tsv")
  assert no_header[0] == TextExample("first", "second", 0) and len(no_header) == 3


def test_tsv_single_column_and_errors(tmp_path):
  single = tmp_path / "single.tsv"
  single.write_text("One.\n\nTwo.\n")
  assert load_tsv(single) == [TextExample("One.", None, 0), TextExample("Two.", None, 1)]
  mixed = tmp_path / "mixed.tsv"
  mixed.write_text("a\tb\nc\n")
  with pytest.raises(ValueError, match=r"mixed.tsv, line 2: found 1 column"):
    load_tsv(mixed)
  three = tmp_path / "three.tsv"
  three.write_text("a\tb\tc\n")
  with pytest.raises(ValueError, match="line 1: expected 1 .* or 2 .* found 3"):
    load_tsv(three)
  with pytest.raises(FileNotFoundError):
    load_tsv(tmp_path / "none.tsv")


def test_label_column_of_a_pair_tsv(tmp_path):
  # issue 28: an SST-2 TSV (sentence, label) read as tsv: has labels as sentence B.
  from heads_jax.data.text import label_column
  sst2 = [TextExample(f"sentence {i} here", str(i % 2), i) for i in range(6)]
  assert label_column(sst2) == "'0', '1'"
  words = [TextExample(f"s {i}", ("positive", "negative")[i % 2], i) for i in range(4)]
  assert label_column(words) == "'negative', 'positive'"
  pairs = [TextExample("A cat sat.", "The cat sat down.", 0), TextExample("B", "Dogs bark a lot.", 1)]
  assert label_column(pairs) is None
  assert label_column([TextExample("only a", None, 0)]) is None
  assert label_column(words[:2]) is None  # two rows of one word each: too few to tell


@pytest.mark.parametrize("encoding,bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
                                          ("utf-32-le", b"\xff\xfe\x00\x00"),
                                          ("utf-32-be", b"\x00\x00\xfe\xff"),
                                          ("utf-8", b"\xef\xbb\xbf")])
def test_a_utf16_or_utf32_file_is_read_by_its_byte_order_mark(tmp_path, encoding, bom):
  text = "Héllo wörld, naïve café.\n\nSecond line – ok.\n"
  (tmp_path / "s.txt").write_bytes(bom + text.encode(encoding))
  assert load_text(tmp_path / "s.txt") == [TextExample("Héllo wörld, naïve café.", None, 0),
                                           TextExample("Second line – ok.", None, 1)]
  (tmp_path / "p.tsv").write_bytes(bom + "a b\tc d\nç\té\n".encode(encoding))
  assert load_tsv(tmp_path / "p.tsv") == [TextExample("a b", "c d", 0), TextExample("ç", "é", 1)]


def test_a_byte_order_mark_over_other_bytes_says_what_it_is(tmp_path):
  from heads_jax.errors import UserError
  (tmp_path / "s.txt").write_bytes(b"\xff\xfeA\x00\x00\xd8")  # a lone UTF-16 surrogate
  with pytest.raises(UserError) as e:
    load_text(tmp_path / "s.txt")
  assert str(e.value) == (f"{tmp_path / 's.txt'}: starts with a UTF-16 byte-order mark but is not "
                          f"UTF-16 text; convert the file to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 "
                          f"IN > OUT)")
