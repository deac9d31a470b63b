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
statistics and report: token classes, relation ids, and the role registry (`REGISTRY`: per role
its name, coarse group, sieve kind and parameters, kernel code, report colour/label/marker and
the paper's name; `ROLES` and every other role table are derived from it).
"""

import dataclasses

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

# ---------------------------------------------------------------------------------------------
# The role registry: the one table of the roles. Every stage reads it (the sieves, the XLA
# statistics and the Pallas kernel, hoststats' coarse roles and calibration, the report's colours
# and markers), so a new role is one `Role` row here (plus, for a new *kind* of sieve, its
# construction in `heads_jax.sieves` and the kernel).

# Sieve kinds: how ``heads_jax.sieves`` builds S(t) of a role from its parameters.
SIEVE_OFFSETS = "offsets"      # {s : lo <= s - t <= hi} (``Role.offsets = (lo, hi)``)
SIEVE_BLOCK = "block"          # non-special keys with t's token type, pairs only
SIEVE_KEYS = "keys"            # fixed key positions (``Role.keys``, a subset of KEY_KINDS)
SIEVE_RELATION = "relation"    # dependency arcs with a relation in ``Role.relations``
SIEVE_KINDS = (SIEVE_OFFSETS, SIEVE_BLOCK, SIEVE_KEYS, SIEVE_RELATION)
# Key kinds of SIEVE_KEYS: position 0 ([CLS]) and the [SEP] positions (disjoint sets).
KEY_POSITION0 = "position0"
KEY_SEP = "sep"
KEY_KINDS = (KEY_POSITION0, KEY_SEP)

# The Pallas kernel's code per sieve kind (`heads_jax.stats.fused` dispatches on these).
KERNEL_OFFSETS, KERNEL_BLOCK, KERNEL_KEYS, KERNEL_RELATION = range(4)
KERNEL_CODES = {SIEVE_OFFSETS: KERNEL_OFFSETS, SIEVE_BLOCK: KERNEL_BLOCK, SIEVE_KEYS: KERNEL_KEYS,
                SIEVE_RELATION: KERNEL_RELATION}

# Coarse roles (Pande et al. 2021 section "Related work": "we focus on local, syntactic, block,
# and delimiter heads"), in the order of the summary figures, with their report colours.
COARSE_LOCAL, COARSE_SYNTACTIC, COARSE_DELIMITER, COARSE_BLOCK = (
    "local", "syntactic", "delimiter", "block")
COARSE_GROUPS = (COARSE_LOCAL, COARSE_SYNTACTIC, COARSE_DELIMITER, COARSE_BLOCK)
COARSE_COLORS = {COARSE_LOCAL: "#1b7837", COARSE_SYNTACTIC: "#b2182b",
                 COARSE_DELIMITER: "#2c7fb8", COARSE_BLOCK: "#9467bd"}


@dataclasses.dataclass(frozen=True)
class Role:
  """One role of the registry.

  Attributes:
    name: the role's name (the ``roles`` axis of scores.npz, the ``role`` column of tests.csv).
    group: its coarse role (one of `COARSE_GROUPS`), or None (not part of any, e.g.
      ``block_plain``).
    sieve: its sieve kind (`SIEVE_KINDS`); the parameters below say which sieve of that kind.
    offsets: ``(lo, hi)`` of a `SIEVE_OFFSETS` role.
    keys: the key kinds (`KEY_KINDS`) of a `SIEVE_KEYS` role (their union).
    relations: the ``REL_*`` ids of a `SIEVE_RELATION` role (their union).
    entropy_weighted: the score is the sieve bias times the query row's entropy (the authors'
      released code for ``block``); only with `SIEVE_BLOCK` in the XLA per-layer path.
    plain_twin: the role with the same sieve and no entropy factor (calibration's test C).
    color: the report's colour.
    label: the report's label.
    marker: the role grid's marker (matplotlib), None when not drawn in the grid.
    grid: its position in the role grid (Pande et al. Fig. 5), None when not drawn.
    paper: what the paper calls it.
  """
  name: str
  group: str | None
  sieve: str
  color: str
  label: str
  paper: str
  offsets: tuple[int, int] | None = None
  keys: tuple[str, ...] = ()
  relations: tuple[int, ...] = ()
  entropy_weighted: bool = False
  plain_twin: str | None = None
  marker: str | None = None
  grid: int | None = None

  @property
  def kernel(self) -> int:
    """The Pallas kernel's code of this role (`KERNEL_CODES` of its sieve kind)."""
    return KERNEL_CODES[self.sieve]

  def __post_init__(self):
    if self.sieve not in SIEVE_KINDS:
      raise ValueError(f"role {self.name!r}: sieve kind must be one of {SIEVE_KINDS}, "
                       f"got {self.sieve!r}")
    if self.group is not None and self.group not in COARSE_GROUPS:
      raise ValueError(f"role {self.name!r}: group must be one of {COARSE_GROUPS} or None")
    if (self.sieve == SIEVE_OFFSETS) != (self.offsets is not None):
      raise ValueError(f"role {self.name!r}: offsets (lo, hi) go with the {SIEVE_OFFSETS!r} kind")
    if self.offsets is not None and self.offsets[0] > self.offsets[1]:
      raise ValueError(f"role {self.name!r}: offsets {self.offsets} need lo <= hi")
    if (self.sieve == SIEVE_KEYS) != bool(self.keys) or set(self.keys) - set(KEY_KINDS):
      raise ValueError(f"role {self.name!r}: keys (a subset of {KEY_KINDS}) go with the "
                       f"{SIEVE_KEYS!r} kind")
    if (self.sieve == SIEVE_RELATION) != bool(self.relations) or \
        set(self.relations) - set(RELATION_LABELS.values()):
      raise ValueError(f"role {self.name!r}: relations (REL_* ids) go with the "
                       f"{SIEVE_RELATION!r} kind")


def _relation_role(name, rel, color, paper, grid):
  return Role(name, COARSE_SYNTACTIC, SIEVE_RELATION, color, name, paper, relations=(rel,),
              marker="^", grid=grid)


# Every role, in the order of DESIGN.md section 3 (and of the `roles` axis of scores.npz).
REGISTRY = (
    Role("local", COARSE_LOCAL, SIEVE_OFFSETS, "#1b7837", "local", "local (|s - t| <= 2)",
         offsets=(-2, 2)),
    Role("prev_local", COARSE_LOCAL, SIEVE_OFFSETS, "#2ca02c", "previous tokens",
         "local: previous token", offsets=(-2, -1), marker="o", grid=6),
    Role("next_local", COARSE_LOCAL, SIEVE_OFFSETS, "#98df8a", "next tokens",
         "local: next token", offsets=(1, 2), marker="o", grid=7),
    Role("block", COARSE_BLOCK, SIEVE_BLOCK, "#9467bd", "block", "block",
         entropy_weighted=True, plain_twin="block_plain", marker="D", grid=8),
    Role("block_plain", None, SIEVE_BLOCK, "#c5b0d5", "block (no entropy factor)",
         "block, without the entropy factor"),
    Role("cls", COARSE_DELIMITER, SIEVE_KEYS, "#1f77b4", "[CLS]", "delimiter: [CLS]",
         keys=(KEY_POSITION0,), marker="s", grid=0),
    Role("sep", COARSE_DELIMITER, SIEVE_KEYS, "#17becf", "[SEP]", "delimiter: [SEP]",
         keys=(KEY_SEP,), marker="s", grid=1),
    Role("delimiter", COARSE_DELIMITER, SIEVE_KEYS, "#2c7fb8", "delimiter",
         "vertical/delimiter", keys=(KEY_POSITION0, KEY_SEP)),
    _relation_role("nsubj", REL_NSUBJ, "#d62728", "syntactic: nsubj", 2),
    _relation_role("obj", REL_OBJ, "#ff7f0e", "syntactic: dobj", 3),
    _relation_role("amod", REL_AMOD, "#e377c2", "syntactic: amod", 4),
    _relation_role("advmod", REL_ADVMOD, "#8c564b", "syntactic: advmod", 5),
    Role("syntactic", COARSE_SYNTACTIC, SIEVE_RELATION, "#b2182b", "syntactic",
         "syntactic (union of the four relations)",
         relations=(REL_NSUBJ, REL_OBJ, REL_AMOD, REL_ADVMOD)),
)
ROLE_TABLE = {r.name: r for r in REGISTRY}
ROLES = tuple(r.name for r in REGISTRY)
SYNTACTIC_ROLES = tuple(r.name for r in REGISTRY if r.group == COARSE_SYNTACTIC)
# Fine roles of each coarse role, in registry order.
COARSE_ROLES = {g: tuple(r.name for r in REGISTRY if r.group == g) for g in COARSE_GROUPS}
# The role grid's roles (Pande et al. Fig. 5), in grid order.
GRID_ROLES = tuple(r.name for r in sorted((r for r in REGISTRY if r.grid is not None),
                                          key=lambda r: r.grid))
# Roles whose score is bias x row entropy, and each one's bare twin (calibration's test C).
ENTROPY_WEIGHTED = tuple(r.name for r in REGISTRY if r.entropy_weighted)
PLAIN_TWINS = {r.name: r.plain_twin for r in REGISTRY if r.plain_twin}
# The fine roles whose sieve bias the summary correlates (Spearman, Pande et al.'s local vs
# syntactic), and the coarse pair of ``share_syntactic_also_local`` (first, also second).
SPEARMAN_ROLES = ("local", "syntactic")
ALSO_COARSE = (COARSE_SYNTACTIC, COARSE_LOCAL)
# Fine-role overlaps Pande et al. discuss: a subject's head word mostly follows it, an object's
# precedes it.
FINE_OVERLAPS = (("nsubj", "next_local"), ("obj", "prev_local"))


def role(name: str) -> Role:
  """The registry row of a role; a clear ValueError for an unknown name."""
  try:
    return ROLE_TABLE[name]
  except KeyError:
    raise ValueError(f"unknown role {name!r}; the roles are {list(ROLES)} "
                     f"(heads_jax/data/vocabulary.py REGISTRY)") from None


def role_order(names) -> tuple[str, ...]:
  """Known roles in `ROLES` order, then unknown ones in first-seen order."""
  names = list(dict.fromkeys(names))
  known = [r for r in ROLES if r in names]
  return tuple(known + [r for r in names if r not in ROLE_TABLE])


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
