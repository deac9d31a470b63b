"""Tokenizer loading: vocab.txt (not the silently-ignored BertTokenizer(vocab_file=...)), HF dirs."""
import json

import pytest

from heads_jax.data import assets
from heads_jax.data.tokenizer import load_tokenizer


def test_default_is_embedded_uncased_vocab():
  tok = load_tokenizer()
  assert len(tok) == 30522
  assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 100, 101, 102, 103]
  assert tok.tokenize("He was unaffable.") == ["he", "was", "una", "##ffa", "##ble", "."]


def test_vocab_file_with_case_setting():
  tok = load_tokenizer(assets.vocab_path(), do_lower_case=False)
  assert tok.tokenize("Hello hello") == ["[UNK]", "hello"]  # the uncased vocab has no "Hello"


def test_hf_dir_reads_lower_case_from_config_and_argument_overrides(tmp_path):
  load_tokenizer(assets.vocab_path(), do_lower_case=False).save_pretrained(tmp_path / "cased")
  assert json.loads((tmp_path / "cased" / "tokenizer_config.json").read_text())["do_lower_case"] is False
  assert load_tokenizer(tmp_path / "cased").tokenize("Hello") == ["[UNK]"]
  assert load_tokenizer(tmp_path / "cased", do_lower_case=True).tokenize("Hello") == ["hello"]
  only_vocab = tmp_path / "only_vocab"
  only_vocab.mkdir()
  (only_vocab / "vocab.txt").write_bytes(assets.vocab_path().read_bytes())
  assert load_tokenizer(only_vocab).tokenize("Hello") == ["hello"]  # default lower-case


def test_vocab_without_words_is_rejected(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra"]) + "\n")
  with pytest.raises(ValueError, match="tokenise to \\[UNK\\]"):
    load_tokenizer(path)
  bad = tmp_path / "words.txt"
  bad.write_text("the\nof\n")
  with pytest.raises(ValueError, match="lacks the BERT special token"):
    load_tokenizer(bad)


def test_missing_paths(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_tokenizer(tmp_path / "nope")
  with pytest.raises(ValueError, match="no tokenizer.json or vocab.txt"):
    load_tokenizer(tmp_path)
