"""DeBERTa-v2/v3 tokenizers from a SentencePiece ``spm.model`` without the ``sentencepiece``
package.

A DeBERTa-v3 directory on the Hugging Face hub ships ``spm.model`` (a SentencePiece
``ModelProto``) and ``tokenizer_config.json``, no ``tokenizer.json``. transformers builds its
fast ``DebertaV2Tokenizer`` (a ``tokenizers`` Unigram model) from the proto's pieces and scores,
but reads the proto through ``sentencepiece``, which heads_jax does not depend on. Here the
proto is read with ``protobuf`` (transformers' own ``sentencepiece_model_pb2`` schema) and the
same tokenizer is built from it: ``DebertaV2Tokenizer(vocab=[(piece, score), ...],
unk_id=...)`` with the directory's ``do_lower_case``, ``split_by_punct`` and special tokens.
``DebertaV2Tokenizer`` sets its own normaliser (whitespace, NFC, optional lower-casing) and
Metaspace pre-tokeniser, as transformers does; the proto's normaliser rules are not read by
transformers either. Once saved (``save_pretrained``) the directory has a ``tokenizer.json`` and
loads like any other.
"""

from __future__ import annotations

import json
from pathlib import Path

SPM_FILE = "spm.model"
# SentencePiece piece types (sentencepiece_model.proto): NORMAL 1, UNKNOWN 2, CONTROL 3,
# USER_DEFINED 4, UNUSED 5, BYTE 6.
UNKNOWN = 2
_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
               "mask_token")


def _model_proto():
  from transformers.utils import sentencepiece_model_pb2_new  # protobuf >= 4 schema
  return sentencepiece_model_pb2_new.ModelProto()


def read_spm(path) -> tuple[list[tuple[str, float]], int]:
  """``(pieces, unk_id)`` of a SentencePiece model file: every piece with its score, in id
  order, and the id of the unknown piece. A file that is not a Unigram SentencePiece model is a
  ValueError naming it."""
  path = Path(path)
  proto = _model_proto()
  try:
    proto.ParseFromString(path.read_bytes())
  except Exception as e:  # protobuf's DecodeError and friends
    raise ValueError(f"{path} is not a SentencePiece model ({type(e).__name__}: {e}); copy or "
                     "download the tokenizer again") from None
  if not proto.pieces:
    raise ValueError(f"{path} holds no SentencePiece pieces; copy or download the tokenizer again")
  if proto.trainer_spec.model_type not in (0, 1):  # 0 unset (Unigram by default), 1 UNIGRAM
    raise ValueError(f"{path} is not a Unigram SentencePiece model (model_type "
                     f"{proto.trainer_spec.model_type}); DeBERTa's tokenizer is Unigram")
  pieces = [(p.piece, float(p.score)) for p in proto.pieces]
  unknown = [i for i, p in enumerate(proto.pieces) if p.type == UNKNOWN]
  unk_id = unknown[0] if unknown else int(proto.trainer_spec.unk_id)
  return pieces, unk_id


def tokenizer_from_spm_dir(path):
  """transformers' fast ``DebertaV2Tokenizer`` of a directory holding ``spm.model`` (and
  optionally ``tokenizer_config.json`` / ``special_tokens_map.json``)."""
  from transformers import DebertaV2Tokenizer
  path = Path(path)
  pieces, unk_id = read_spm(path / SPM_FILE)
  settings = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    f = path / name
    if f.is_file():
      try:
        settings.update(json.loads(f.read_text(encoding="utf-8")))
      except ValueError as e:
        raise ValueError(f"{f} is not valid JSON ({e}); copy or download the tokenizer again") from None
  kwargs = {k: bool(settings[k]) for k in ("do_lower_case", "split_by_punct") if k in settings}
  for key in _TOKEN_KEYS:
    token = settings.get(key)
    if isinstance(token, dict):  # an AddedToken as JSON
      token = token.get("content")
    if isinstance(token, str):
      kwargs[key] = token
  if "model_max_length" in settings:
    kwargs["model_max_length"] = settings["model_max_length"]
  return DebertaV2Tokenizer(vocab=pieces, unk_id=unk_id, **kwargs)
