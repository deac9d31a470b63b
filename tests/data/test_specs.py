"""Data spec strings -> datasets -> encoded batch streams."""
from pathlib import Path

import numpy as np
import pytest
from spacy.tokens import Doc
from spacy.vocab import Vocab

from heads_jax.data import assets
from heads_jax.data import vocabulary as B
from heads_jax.data.specs import SPEC_FORMS, encode_spec, load_spec, parse_spec
from heads_jax.data.syntax import MissingParserError
from heads_jax.data.tokenizer import load_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def chain_parser(text):
  """Whitespace words; word i is the nsubj dependent of word i+1, the last word the root."""
  words = text.split()
  n = len(words)
  return Doc(Vocab(), words=words, heads=[min(i + 1, n - 1) for i in range(n)],
             deps=["nsubj"] * (n - 1) + ["ROOT"])


def test_parse_all_forms():
  s = parse_spec(f"conllu:{FIXTURES / 'mini.conllu'}")
  assert (s.kind, s.path) == ("conllu", FIXTURES / "mini.conllu")
  assert (parse_spec("glue:sst2").task, parse_spec("glue:sst2").split) == ("sst2", "validation")
  assert parse_spec("glue:QNLI:test").split == "test"
  s = parse_spec(f"glue-tsv:{FIXTURES / 'glue' / 'MRPC'}:test")
  assert (s.kind, s.task, s.split) == ("glue-tsv", "mrpc", "test")
  s = parse_spec(f"glue-tsv:{FIXTURES / 'glue'}/qnli")  # DIR/TASK with a lower-case task name
  assert (s.task, s.split, s.path) == ("qnli", "dev", FIXTURES / "glue")
  s = parse_spec(f"tsv:{FIXTURES / 'pairs.tsv'}:header")
  assert (s.kind, s.header, s.path) == ("tsv", True, FIXTURES / "pairs.tsv")
  assert not parse_spec(f"tsv:{FIXTURES / 'pairs.tsv'}").header
  assert parse_spec(f"text:{FIXTURES / 'sentences.txt'}").kind == "text"
  assert parse_spec("ud-ewt").path == assets.ud_ewt_test_path()
  assert (parse_spec("mrpc").task, parse_spec("sst2").kind) == ("mrpc", "glue-tsv")


@pytest.mark.parametrize("spec, why", [
    ("", "empty spec"), ("nonsense", "unknown form"), ("csv:x.csv", "unknown kind 'csv'"),
    ("conllu:/no/such/file.conllu", "file /no/such/file.conllu does not exist"),
    ("text:", "unknown form"), ("glue:mnli2", "unknown GLUE task 'mnli2'"),
    (f"glue-tsv:{FIXTURES / 'glue'}/qnli:test", "no test.tsv"),
])
def test_bad_specs_one_line_error_with_forms(spec, why):
  with pytest.raises(ValueError) as e:
    parse_spec(spec)
  msg = str(e.value)
  assert why in msg and "\n" not in msg and all(form in msg for form in SPEC_FORMS)


def test_load_spec_flags():
  ud = load_spec("ud-ewt", max_examples=5)
  assert (len(ud), ud.gold_arcs, ud.pairs, ud.labels) == (5, True, False, None)
  mrpc = load_spec("mrpc")
  assert (len(mrpc), mrpc.gold_arcs, mrpc.pairs) == (408, False, True)
  assert sum(mrpc.labels) == 279
  assert load_spec(f"tsv:{FIXTURES / 'pairs.tsv'}:header").pairs
  assert not load_spec(f"text:{FIXTURES / 'sentences.txt'}").pairs


def test_encode_conllu_gold_arcs(tok):
  info, batches, n = encode_spec(f"conllu:{FIXTURES / 'mini.conllu'}", tok, batch_size=2)
  assert n == 3 and info.arcs == "gold" and info.settings()["num_examples"] == 3
  (i0, b0), (i1, b1) = list(batches)
  assert i0.tolist() == [0, 1] and i1.tolist() == [2]
  # "I do n't see it ." -> i do n ' t see it . ; nsubj(I -> see), advmod(n't -> see), obj(it -> see)
  assert tok.convert_ids_to_tokens(b0["input_ids"][0, :10].tolist()) == [
      "[CLS]", "i", "do", "n", "'", "t", "see", "it", ".", "[SEP]"]
  np.testing.assert_array_equal(b0["word_ids"][0, :10], [-1, 0, 1, 2, 2, 2, 3, 4, 5, -1])
  np.testing.assert_array_equal(b0["dep_head"][0, :10], [-1, 3, 3, 3, 3, 3, -1, 3, 3, -1])
  np.testing.assert_array_equal(b0["dep_rel"][0, :10], [0, 1, 0, 4, 4, 4, 0, 2, 0, 0])
  assert b0["dep_rel"][1, 1] == B.REL_NONE  # nsubj:pass does not count as nsubj
  np.testing.assert_array_equal(b1["dep_rel"][0, :5], [0, B.REL_AMOD, 0, 0, 0])
  _, batches, _ = encode_spec(f"conllu:{FIXTURES / 'mini.conllu'}", tok, syntax=False)
  idx, b = next(batches)
  assert (b["dep_head"] == -1).all() and (b["dep_rel"] == 0).all()
  np.testing.assert_array_equal(b["word_ids"][0, :10], [-1, 0, 1, 2, 2, 2, 3, 4, 5, -1])


def test_encode_pairs_with_callable_parser(tok):
  info, batches, n = encode_spec(f"tsv:{FIXTURES / 'pairs.tsv'}:header", tok, parser=chain_parser)
  assert n == 2 and info.arcs == "parser:chain_parser" and info.dataset.pairs
  idx, b = next(batches)
  assert tok.convert_ids_to_tokens(b["input_ids"][0, :12].tolist()) == [
      "[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "cat", "was", "sitting", ".", "[SEP]"]
  # parser words: The cat sat. | A cat was sitting.  ("sat." and "sitting." are one word each)
  np.testing.assert_array_equal(b["word_ids"][0, :12], [-1, 0, 1, 2, 2, -1, 3, 4, 5, 6, 6, -1])
  np.testing.assert_array_equal(b["dep_head"][0, :12], [-1, 1, 2, -1, -1, -1, 4, 5, 6, -1, -1, -1])
  np.testing.assert_array_equal(b["token_type_ids"][0, :12], [0] * 6 + [1] * 6)


def test_encode_text_without_syntax_and_missing_parser(tok):
  info, batches, n = encode_spec(f"text:{FIXTURES / 'sentences.txt'}", tok, syntax=False,
                                 max_examples=2)
  assert n == 2 and info.arcs is None
  idx, b = next(batches)
  assert idx.tolist() == [0, 1] and (b["dep_head"] == -1).all()
  with pytest.raises(MissingParserError, match="--no-syntax"):  # raised before any batch
    encode_spec(f"text:{FIXTURES / 'sentences.txt'}", tok, parser="no_such_pipeline")


def test_encode_glue_tfds_mock(tok, tmp_path):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=6, data_dir=str(tmp_path)):
    info, batches, n = encode_spec("glue:mrpc", tok, batch_size=4, syntax=False, max_length=32)
  assert n == 6 and info.dataset.pairs and len(info.dataset.labels) == 6
  out = list(batches)
  assert [i.tolist() for i, _ in out] == [[0, 1, 2, 3], [4, 5]]
  types = out[0][1]["token_type_ids"]
  assert (types.max(1) == 1).all()  # every row has a segment B


def test_encode_embedded_ud_ewt_all(tok):
  info, batches, n = encode_spec("ud-ewt", tok, batch_size=128, sort_window=512)
  total = 0
  rels = np.zeros(5, np.int64)
  for idx, b in batches:
    total += len(idx)
    assert b["input_ids"].shape[1] % 16 == 0
    first = (b["word_ids"][:, 1:] != b["word_ids"][:, :-1]) & (b["word_ids"][:, 1:] >= 0)
    rels += np.bincount(b["dep_rel"][:, 1:][first], minlength=5)  # one count per word
  assert total == n == 2077
  # exact-label counts of the file (see test_data_conllu) minus arcs lost to truncation at 128
  assert rels[1:].tolist() == pytest.approx([1950, 1153, 1247, 1324], abs=25)
  assert (rels[1:] <= [1950, 1153, 1247, 1324]).all()


def test_counts_of_empty_truncated_and_duplicated_examples(tmp_path, tok):
  # issue 28: a line with no wordpiece (a zero-width space) was a bare [CLS] [SEP] sequence
  # counted in the tests; cut and repeated sentences were counted nowhere.
  long = " ".join(["word"] * 2000)  # 2,000 pieces ("word" is one wordpiece)
  path = tmp_path / "s.txt"
  path.write_text(f"the cat sat\n\u200b\n{long}\nthe cat sat\na dog\n")
  info, batches, n = encode_spec(f"text:{path}", tok, max_length=16, batch_size=8, syntax=False)
  assert n == 4 and [e.text_a for e in info.dataset.examples] == ["the cat sat", long,
                                                                  "the cat sat", "a dog"]
  c = info.counts
  assert (c.read, c.empty, c.truncated, c.duplicates) == (5, 1, 1, 1)
  s = info.settings()
  assert (s["num_read"], s["num_empty_dropped"], s["num_truncated"], s["num_duplicates"]) == (5, 1, 1, 1)
  assert c.text(16) == ("5 read, 1 with no wordpiece dropped, 1 truncated to 16 wordpieces, "
                        "1 duplicate(s) of an earlier example (kept)")
  rows = [r for _, b in batches for r in b["attention_mask"].sum(1)]
  assert sorted(int(r) for r in rows if r) == [4, 5, 5, 16]  # [CLS] a dog [SEP]; the long one cut
  # 14 pieces + [CLS] [SEP] = 16 fits exactly: not truncated; 15 is
  path.write_text(" ".join(["word"] * 14) + "\n" + " ".join(["word"] * 15) + "\n")
  info, _, _ = encode_spec(f"text:{path}", tok, max_length=16, syntax=False)
  assert info.counts.truncated == 1
  # pairs: 3 special tokens; an empty B drops the pair
  tsv = tmp_path / "p.tsv"
  tsv.write_text("a b c\td e f\ng h\t\u200b\n")
  info, _, n = encode_spec(f"tsv:{tsv}", tok, max_length=9, syntax=False)  # 3 + 3 + 3 = 9 fits
  assert n == 1 and (info.counts.empty, info.counts.truncated) == (1, 0)
  tsv.write_text("a b c\td e f g\n")
  info, _, _ = encode_spec(f"tsv:{tsv}", tok, max_length=9, syntax=False)  # 3 + 4 + 3 = 10 > 9
  assert info.counts.truncated == 1


def test_input_errors_name_the_cause(tmp_path):
  # issue 28: a directory said "does not exist"; --max-examples 0/-1 blamed the data.
  with pytest.raises(ValueError, match=f"{tmp_path} is a directory; give a file"):
    parse_spec(f"text:{tmp_path}")
  (tmp_path / "s.txt").write_text("one\ntwo\n")
  for bad in (0, -1):
    with pytest.raises(ValueError, match=f"--max-examples must be a positive number .* got {bad}"):
      load_spec(f"text:{tmp_path / 's.txt'}", max_examples=bad)


def test_tsv_with_a_label_column_warns(tmp_path, tok):
  # issue 28: an SST-2 TSV read as tsv: made its label column sentence B without a word.
  path = tmp_path / "sst2.tsv"
  path.write_text("".join(f"sentence number {i}\t{i % 2}\n" for i in range(6)))
  ds = load_spec(f"tsv:{path}")
  assert ds.pairs and len(ds.warnings) == 1
  assert "the second column holds only '0', '1' (class labels?)" in ds.warnings[0]
  assert "glue-tsv:DIR/TASK" in ds.warnings[0]
  info, _, _ = encode_spec(f"tsv:{path}", tok, syntax=False)
  assert info.settings()["warnings"] == list(ds.warnings)
  path.write_text("a cat\tthe cat sat down\nb\tdogs bark\n")
  assert load_spec(f"tsv:{path}").warnings == ()
