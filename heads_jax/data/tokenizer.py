"""WordPiece tokenizer loading (transformers ``BertTokenizerFast``), checked to really work.

transformers 5 traps avoided here: ``BertTokenizer(vocab_file=...)`` silently ignores the file
(every word becomes ``[UNK]``), so a vocab.txt is loaded with ``BertTokenizerFast(vocab=...)``
and every loaded tokenizer is checked on a probe sentence. Encoding code must always pass
``max_length`` (and ``truncation=True``): ``model_max_length`` is unset for a bare vocab.
"""

import json
from pathlib import Path

from transformers import BertTokenizerFast

from heads_jax.data.assets import vocab_path

_PROBE = "the of and to in is was that it for on with as he be at by this had not are but from"
_SPECIALS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


def _dir_lower_case(path: Path) -> bool | None:
  config = path / "tokenizer_config.json"
  if config.is_file():
    with open(config, encoding="utf-8") as f:
      value = json.load(f).get("do_lower_case")
    if value is not None:
      return bool(value)
  return None


def check_tokenizer(tokenizer, source="tokenizer") -> None:
  """Raises ValueError if the special tokens are missing or common English words are all
  ``[UNK]`` (an ignored or wrong vocabulary)."""
  vocab = tokenizer.get_vocab()  # includes tokens the loader added on top of the file's vocab
  missing = [t for t in _SPECIALS if vocab.get(t, tokenizer.vocab_size) >= tokenizer.vocab_size]
  if missing:
    raise ValueError(f"{source}: vocabulary lacks the BERT special token(s) {missing}; "
                     "is this a BERT WordPiece vocab.txt / tokenizer directory?")
  ids = tokenizer(_PROBE, add_special_tokens=False, truncation=True, max_length=64)["input_ids"]
  known = [i for i in ids if i != tokenizer.unk_token_id]
  if len(known) < len(ids) // 2:
    raise ValueError(f"{source}: {len(ids) - len(known)} of {len(ids)} common English words "
                     "tokenise to [UNK]; the vocabulary was not loaded (or does not match the "
                     "lower-casing setting). Pass an HF tokenizer folder or a vocab.txt.")


def load_tokenizer(path_or_vocab=None, do_lower_case: bool | None = None) -> BertTokenizerFast:
  """A ``BertTokenizerFast`` from a Hugging Face folder or a ``vocab.txt`` file.

  ``path_or_vocab`` None: the embedded ``bert-base-uncased`` vocabulary. Lower-casing: the
  ``do_lower_case`` argument if given, else the folder's ``tokenizer_config.json``, else True.
  """
  if path_or_vocab is None:
    path_or_vocab = vocab_path()
  path = Path(path_or_vocab)
  if path.is_dir():
    if not any((path / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
      raise ValueError(f"{path} holds no tokenizer.json or vocab.txt: pass a Hugging Face "
                       "tokenizer/model folder or a WordPiece vocab.txt file")
    kwargs = {}
    if do_lower_case is not None:
      kwargs["do_lower_case"] = do_lower_case
    elif _dir_lower_case(path) is None:
      kwargs["do_lower_case"] = True
    tokenizer = BertTokenizerFast.from_pretrained(str(path), **kwargs)
  elif path.is_file():
    tokenizer = BertTokenizerFast(vocab=str(path),
                                  do_lower_case=True if do_lower_case is None else do_lower_case)
  else:
    raise FileNotFoundError(f"tokenizer path {path} does not exist: pass a Hugging Face "
                            "tokenizer/model folder or a WordPiece vocab.txt file")
  check_tokenizer(tokenizer, str(path))
  return tokenizer
