"""Tokenizer loading, checked to really work: WordPiece (BERT, DistilBERT, ELECTRA), byte-level
BPE (RoBERTa; ModernBERT, whose ``tokenizer.json`` carries BERT's ``[CLS] A [SEP] B [SEP]``
template) and SentencePiece (XLM-RoBERTa, ALBERT, DeBERTa-v3).

A WordPiece folder or a ``vocab.txt`` file gives a ``transformers.BertTokenizerFast``; any other
tokenizer folder (``tokenizer_config.json`` naming another class, or ``vocab.json`` +
``merges.txt``, ``sentencepiece.bpe.model``, ``spiece.model`` next to a ``config.json``) is read
with ``AutoTokenizer`` and must be a fast (Rust) tokenizer, which gives the character offsets
and word ids that word alignment needs. A folder may also be a Hugging Face hub id found in the
local hub cache (``heads_jax.hub``).

transformers 5 traps avoided here: ``BertTokenizer(vocab_file=...)`` silently ignores the file
(every word becomes ``[UNK]``; ``RobertaTokenizer(vocab_file=...)`` likewise), so a vocab.txt is
loaded with ``BertTokenizerFast(vocab=...)`` and every loaded tokenizer is checked on a probe
sentence. Encoding code must always pass ``max_length`` (and ``truncation=True``):
``model_max_length`` is unset for a bare vocab.
"""

import json
from pathlib import Path

from transformers import BertTokenizerFast   # AutoTokenizer where used: it imports torch, if installed

from heads_jax import hub
from heads_jax.data.assets import vocab_path
from heads_jax.data.spm import SPM_FILE, tokenizer_from_spm_dir

_PROBE = "the of and to in is was that it for on with as he be at by this had not are but from"
_SPECIALS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
# Tokenizer classes read as BertTokenizerFast (the same WordPiece tokenizer under other names).
WORDPIECE_CLASSES = {"BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer",
                     "DistilBertTokenizerFast", "ElectraTokenizer", "ElectraTokenizerFast"}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model",
                   "spiece.model", "spm.model")


def _read_json(file: Path) -> dict:
  """A tokenizer folder's JSON file; a damaged one is a ValueError naming it."""
  try:
    with open(file, encoding="utf-8") as f:
      doc = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{file} is not valid JSON ({e}); copy or export the model's tokenizer "
                     "again") from None
  return doc if isinstance(doc, dict) else {}


def _tokenizer_config(path: Path) -> dict:
  config = path / "tokenizer_config.json"
  return _read_json(config) if config.is_file() else {}


def _dir_lower_case(path: Path) -> bool | None:
  value = _tokenizer_config(path).get("do_lower_case")
  return None if value is None else bool(value)


def _is_wordpiece_dir(path: Path) -> bool:
  cls = _tokenizer_config(path).get("tokenizer_class")
  if cls is not None:
    return cls in WORDPIECE_CLASSES
  if (path / "vocab.txt").is_file():
    return True
  if (path / "tokenizer.json").is_file():
    return (_read_json(path / "tokenizer.json").get("model") or {}).get("type") == "WordPiece"
  return False


def check_tokenizer(tokenizer, source="tokenizer") -> None:
  """Raises ValueError if the special tokens are missing (BERT's five for a WordPiece
  tokenizer; the tokenizer's own start, separator and padding tokens otherwise) or common
  English words are mostly unknown (an ignored or wrong vocabulary)."""
  vocab = tokenizer.get_vocab()  # includes tokens the loader added on top of the file's vocab
  if isinstance(tokenizer, BertTokenizerFast):
    missing = [t for t in _SPECIALS if vocab.get(t, tokenizer.vocab_size) >= tokenizer.vocab_size]
    if missing:
      raise ValueError(f"{source}: vocabulary lacks the BERT special token(s) {missing}; "
                       "is this a BERT WordPiece vocab.txt / tokenizer directory?")
  else:
    roles = {"start (cls_token)": tokenizer.cls_token, "separator (sep_token)": tokenizer.sep_token,
             "padding (pad_token)": tokenizer.pad_token}
    missing = [f"{role} {token!r}" for role, token in roles.items() if token is None or token not in vocab]
    if missing:
      raise ValueError(f"{source}: the tokenizer lacks its special token(s) {', '.join(missing)}; "
                       "heads_jax needs a start token and a separator to encode sequences")
  ids = tokenizer(_PROBE, add_special_tokens=False, truncation=True, max_length=64)["input_ids"]
  known = [i for i in ids if i != tokenizer.unk_token_id]
  if len(known) < len(ids) // 2:
    raise ValueError(f"{source}: {len(ids) - len(known)} of {len(ids)} common English words "
                     "tokenise to [UNK]; the vocabulary was not loaded (or does not match the "
                     "lower-casing setting). Pass an HF tokenizer folder or a vocab.txt.")


def load_tokenizer(path_or_vocab=None, do_lower_case: bool | None = None):
  """A fast tokenizer from a Hugging Face folder (or hub id in the local cache) or a WordPiece
  ``vocab.txt`` file.

  ``path_or_vocab`` None: the embedded ``bert-base-uncased`` vocabulary. WordPiece lower-casing:
  the ``do_lower_case`` argument if given, else the folder's ``tokenizer_config.json``, else
  True; other tokenizers keep their own normalisation (``do_lower_case`` must then be None).
  """
  if path_or_vocab is None:
    path_or_vocab = vocab_path()
  path = Path(path_or_vocab)
  if not path.exists() and hub.looks_like_repo_id(str(path_or_vocab)):
    path = hub.resolve(str(path_or_vocab))
  if path.is_dir():
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
      raise ValueError(f"{path} holds no tokenizer.json or vocab.txt (nor vocab.json + "
                       "merges.txt, sentencepiece.bpe.model, spiece.model, spm.model): pass a Hugging Face "
                       "tokenizer/model folder or a WordPiece vocab.txt file")
    if _is_wordpiece_dir(path):
      kwargs = {}
      if do_lower_case is not None:
        kwargs["do_lower_case"] = do_lower_case
      elif _dir_lower_case(path) is None:
        kwargs["do_lower_case"] = True
      tokenizer = BertTokenizerFast.from_pretrained(str(path), **kwargs)
    else:
      if do_lower_case is not None:
        raise ValueError(f"{path}: do_lower_case applies to WordPiece tokenizers only")
      try:
        if (path / SPM_FILE).is_file() and not (path / "tokenizer.json").is_file():
          # DeBERTa-v2/v3 as the hub ships it: read without the sentencepiece package
          tokenizer = tokenizer_from_spm_dir(path)
        else:
          from transformers import AutoTokenizer  # here: its import pulls in torch (seconds)
          tokenizer = AutoTokenizer.from_pretrained(str(path))
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
      if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{path}: {type(tokenizer).__name__} is not a fast (Rust) tokenizer; "
                         "heads_jax needs character offsets (save a tokenizer.json)")
  elif path.is_file():
    tokenizer = BertTokenizerFast(vocab=str(path),
                                  do_lower_case=True if do_lower_case is None else do_lower_case)
  else:
    raise FileNotFoundError(f"tokenizer path {path} does not exist: pass a Hugging Face "
                            "tokenizer/model folder or a WordPiece vocab.txt file")
  check_tokenizer(tokenizer, str(path))
  return tokenizer
