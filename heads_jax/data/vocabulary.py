"""The project's vocabulary: the encoded batch format every analysis input is turned into (host,
numpy), and the names shared by every stage (token classes, relations, roles, distance features).

An encoded batch is a plain ``dict[str, np.ndarray]``; every field has shape ``[b, k]``
(b sequences, k = padded length, positions 0..k-1) and dtype int32:

==================  ===========================================================================
field               meaning
==================  ===========================================================================
``input_ids``       WordPiece ids; 0 (``[PAD]``) on padding.
``attention_mask``  1 on the n real positions ``0..n-1`` of a sequence, 0 on padding.
``token_type_ids``  0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``; 0 on padding.
``token_class``     one of the ``TOKEN_*`` constants below (special tokens and punctuation used
                    by the sieves and the distance features).
``word_ids``        index of the word a wordpiece belongs to (words numbered from 0 over the
                    whole sequence, segment B continuing after segment A); -1 for special
                    tokens and padding.
``dep_head``        for a wordpiece whose word is the dependent of an arc: the word index of the
                    arc's head word (same numbering as ``word_ids``); -1 if the word is a root,
                    has no parse, or the head word was truncated away.
``dep_rel``         the arc's relation as one of the ``REL_*`` constants; ``REL_NONE`` (0) when
                    the relation is not one of the four analysed ones or there is no arc.
==================  ===========================================================================

Because a word has at most one head in a dependency tree, per-wordpiece ``dep_head`` /
``dep_rel`` give both directions of every arc: the dependent -> head sieve of relation R at
query t is ``{s : word_ids[s] == dep_head[t] and dep_rel[t] == R}``, and the reverse
(head -> dependent) sieve is ``{s : dep_head[s] == word_ids[t] and dep_rel[s] == R}``.

This module is numpy-only and holds the constants shared by data, sieves, host
statistics and report (role names and their order, token classes, relation ids).
"""

import numpy as np

# token_class values.
TOKEN_OTHER = 0
TOKEN_CLS = 1
TOKEN_SEP = 2
TOKEN_COMMA = 3
TOKEN_PERIOD = 4
TOKEN_PAD = 5

# dep_rel values: the four relations the syntactic sieves analyse.
REL_NONE = 0
REL_NSUBJ = 1
REL_OBJ = 2
REL_AMOD = 3
REL_ADVMOD = 4

# Relation labels as parsers spell them -> REL_*. UD `obj` and ClearNLP/spaCy `dobj` are the
# same role; subtyped labels (`nsubj:pass`) and spaCy's `nsubjpass` deliberately do not match.
RELATION_LABELS = {
    "nsubj": REL_NSUBJ,
    "obj": REL_OBJ,
    "dobj": REL_OBJ,
    "amod": REL_AMOD,
    "advmod": REL_ADVMOD,
}

# Every role, in the order of DESIGN.md section 3 (and of the `roles` axis of scores.npz).
ROLES = (
    "local", "prev_local", "next_local", "block", "block_plain", "cls", "sep", "delimiter",
    "nsubj", "obj", "amod", "advmod", "syntactic",
)
SYNTACTIC_ROLES = ("nsubj", "obj", "amod", "advmod", "syntactic")

# The 21 distance features of Guan et al., in order.
DISTANCE_FEATURES = tuple(f"window_{i}" for i in range(16)) + ("self", "cls", "sep", "comma", "period")

BATCH_FIELDS = ("input_ids", "attention_mask", "token_type_ids", "token_class", "word_ids",
                "dep_head", "dep_rel")


def empty_batch(b: int, k: int) -> dict:
  """An all-padding batch ``[b, k]`` with the defaults of every field."""
  batch = {f: np.zeros((b, k), np.int32) for f in BATCH_FIELDS}
  batch["token_class"][:] = TOKEN_PAD
  for f in ("word_ids", "dep_head"):
    batch[f][:] = -1
  return batch


def lengths(batch: dict) -> np.ndarray:
  """Real positions per sequence, int32 ``[b]``."""
  return batch["attention_mask"].sum(-1).astype(np.int32)
