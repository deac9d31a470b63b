"""Sieves against hand-built examples and against the loop reference (tests/reference_impl.py)."""

import numpy as np
import pytest

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.sieves import build_sieves, distance_bins

E = set()  # empty sieve


def make_batch(seqs, k):
  """Encoded batch from per-position lists: dicts with classes, types, words, heads, rels."""
  batch = B.empty_batch(len(seqs), k)
  for i, s in enumerate(seqs):
    n = len(s["classes"])
    batch["attention_mask"][i, :n] = 1
    batch["input_ids"][i, :n] = 1000 + np.arange(n)
    batch["token_class"][i, :n] = s["classes"]
    batch["token_type_ids"][i, :n] = s.get("types", [0] * n)
    batch["word_ids"][i, :n] = s.get("words", [-1] * n)
    batch["dep_head"][i, :n] = s.get("heads", [-1] * n)
    batch["dep_rel"][i, :n] = s.get("rels", [0] * n)
  return batch


C, S, O, P, COMMA = B.TOKEN_CLS, B.TOKEN_SEP, B.TOKEN_OTHER, B.TOKEN_PERIOD, B.TOKEN_COMMA

# [CLS] the dog bark ##ed [SEP]: the -det-> dog, dog -nsubj-> barked (root); 2 padding positions.
SINGLE = dict(classes=[C, O, O, O, O, S], words=[-1, 0, 1, 2, 2, -1],
              heads=[-1, 1, 2, -1, -1, -1], rels=[0, 0, B.REL_NSUBJ, 0, 0, 0])
# [CLS] big dogs [SEP] eat bo ##nes . [SEP]: big -amod-> dogs -nsubj-> eat <-obj- bones, . -punct-> eat
PAIR = dict(classes=[C, O, O, S, O, O, O, P, S], types=[0, 0, 0, 0, 1, 1, 1, 1, 1],
            words=[-1, 0, 1, -1, 2, 3, 3, 4, -1],
            heads=[-1, 1, 2, -1, -1, 2, 2, 2, -1],
            rels=[0, B.REL_AMOD, B.REL_NSUBJ, 0, 0, B.REL_OBJ, B.REL_OBJ, 0, 0])

EXPECTED_SINGLE = {
    "local": [{0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}, {1, 2, 3, 4, 5}, {2, 3, 4, 5}, {3, 4, 5}],
    "prev_local": [E, {0}, {0, 1}, {1, 2}, {2, 3}, {3, 4}],
    "next_local": [{1, 2}, {2, 3}, {3, 4}, {4, 5}, {5}, E],
    "block": [E] * 6, "block_plain": [E] * 6,
    "cls": [{0}] * 6, "sep": [{5}] * 6, "delimiter": [{0, 5}] * 6,
    "nsubj": [E, E, {3, 4}, E, E, E], "obj": [E] * 6, "amod": [E] * 6, "advmod": [E] * 6,
    "syntactic": [E, E, {3, 4}, E, E, E],
}
EXPECTED_SINGLE_BOTH = dict(EXPECTED_SINGLE, nsubj=[E, E, {3, 4}, {2}, {2}, E],
                            syntactic=[E, E, {3, 4}, {2}, {2}, E])
A, BB = {1, 2}, {4, 5, 6, 7}
EXPECTED_PAIR = {
    "block": [A, A, A, A, BB, BB, BB, BB, BB], "block_plain": [A, A, A, A, BB, BB, BB, BB, BB],
    "sep": [{3, 8}] * 9, "delimiter": [{0, 3, 8}] * 9, "cls": [{0}] * 9,
    "nsubj": [E, E, {4}, E, E, E, E, E, E],
    "obj": [E, E, E, E, E, {4}, {4}, E, E],
    "amod": [E, {2}, E, E, E, E, E, E, E],
    "advmod": [E] * 9,
    "syntactic": [E, {2}, {4}, E, E, {4}, {4}, E, E],
}
EXPECTED_PAIR_BOTH = dict(
    EXPECTED_PAIR, nsubj=[E, E, {4}, E, {2}, E, E, E, E], obj=[E, E, E, E, {5, 6}, {4}, {4}, E, E],
    amod=[E, {2}, {1}, E, E, E, E, E, E], syntactic=[E, {2}, {1, 4}, E, {2, 5, 6}, {4}, {4}, E, E])


def as_sets(sieves, i, j, k):
  return [set(np.flatnonzero(sieves[i, j, t]).tolist()) for t in range(k)]


@pytest.mark.parametrize("direction,expected", [("dep2head", EXPECTED_SINGLE),
                                                ("both", EXPECTED_SINGLE_BOTH)])
def test_single_with_split_word(direction, expected):
  k = 8
  batch = make_batch([SINGLE], k)
  sieves = np.asarray(build_sieves(batch, B.ROLES, direction))
  assert sieves.shape == (1, len(B.ROLES), k, k) and sieves.dtype == bool
  for j, role in enumerate(B.ROLES):
    want = expected[role] + [E, E]  # padding is never a query
    assert as_sets(sieves, 0, j, k) == want, role
    assert ref.sieve_sets(ref.row_of(batch, 0), role, direction) == expected[role], role
  assert not sieves[0, :, :, 6:].any(), "padding is never a key"


@pytest.mark.parametrize("direction,expected", [("dep2head", EXPECTED_PAIR),
                                                ("both", EXPECTED_PAIR_BOTH)])
def test_pair(direction, expected):
  batch = make_batch([PAIR], 9)
  roles = tuple(expected)
  sieves = np.asarray(build_sieves(batch, roles, direction))
  for j, role in enumerate(roles):
    assert as_sets(sieves, 0, j, 9) == expected[role], role
    assert ref.sieve_sets(ref.row_of(batch, 0), role, direction) == expected[role], role


def test_short_sequences_1_to_3():
  seqs = [dict(classes=[C]), dict(classes=[C, S]), dict(classes=[C, O, S], words=[-1, 0, -1])]
  roles = ("local", "prev_local", "next_local", "cls", "sep", "delimiter", "block", "nsubj")
  sieves = np.asarray(build_sieves(make_batch(seqs, 4), roles))
  expected = [
      {"local": [{0}], "prev_local": [E], "next_local": [E], "cls": [{0}], "sep": [E],
       "delimiter": [{0}]},
      {"local": [{0, 1}, {0, 1}], "prev_local": [E, {0}], "next_local": [{1}, E],
       "cls": [{0}, {0}], "sep": [{1}, {1}], "delimiter": [{0, 1}, {0, 1}]},
      {"local": [{0, 1, 2}] * 3, "prev_local": [E, {0}, {0, 1}], "next_local": [{1, 2}, {2}, E],
       "cls": [{0}] * 3, "sep": [{2}] * 3, "delimiter": [{0, 2}] * 3},
  ]
  for i, exp in enumerate(expected):
    n = i + 1
    for role, want in exp.items():
      assert as_sets(sieves, i, roles.index(role), 4) == want + [E] * (4 - n), (i, role)
    for role in ("block", "nsubj"):
      assert not sieves[i, roles.index(role)].any()


def test_role_order_and_subset_follow_roles_argument():
  batch = make_batch([PAIR], 9)
  full = np.asarray(build_sieves(batch))
  sub = np.asarray(build_sieves(batch, ("syntactic", "cls")))
  np.testing.assert_array_equal(sub[:, 0], full[:, B.ROLES.index("syntactic")])
  np.testing.assert_array_equal(sub[:, 1], full[:, B.ROLES.index("cls")])


@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_random_batches_match_reference(direction):
  rng = np.random.default_rng(1)
  batch = ref.random_batch(rng, 12, 14)
  sieves = np.asarray(build_sieves(batch, B.ROLES, direction))
  for i in range(12):
    row = ref.row_of(batch, i)
    n = int(row["attention_mask"].sum())
    for j, role in enumerate(B.ROLES):
      got = as_sets(sieves, i, j, 14)
      assert got[:n] == ref.sieve_sets(row, role, direction), (i, role)
      assert all(not s for s in got[n:])


def test_bad_arguments_raise_clear_errors():
  batch = make_batch([SINGLE], 8)
  with pytest.raises(ValueError, match="unknown role"):
    build_sieves(batch, ("local", "coreference"))
  with pytest.raises(ValueError, match="direction"):
    build_sieves(batch, direction="head2dep")
  del batch["dep_rel"]
  with pytest.raises(KeyError, match="dep_rel"):
    build_sieves(batch)


def test_distance_bins_by_hand():
  bins = np.asarray(distance_bins(*(make_batch([SINGLE], 8)[f] for f in ("token_class", "attention_mask"))))
  # n = 6; query 1: key 0 [CLS], self, d=1 -> 16//6=2, d=2 -> 32//6=5, d=3 -> 48//6=8, [SEP], padding
  assert bins[0, 1].tolist() == [17, 16, 2, 5, 8, 18, -1, -1]
  # query 0 ([CLS]) attends to itself: self wins over special
  assert bins[0, 0, 0] == 16
  assert (bins[0, 6:] == -1).all()
  # commas and periods take their own feature, never a window
  pair = make_batch([dict(classes=[C, O, COMMA, O, P, S])], 6)
  bins = np.asarray(distance_bins(pair["token_class"], pair["attention_mask"]))
  assert bins[0, 3].tolist() == [17, 5, 19, 16, 20, 18]
  # n = 17: d = 16 -> 256 // 17 = 15 (the last window), d = 15 -> 14, d = 14 -> 13
  long = make_batch([dict(classes=[C] + [O] * 16)], 17)
  bins = np.asarray(distance_bins(long["token_class"], long["attention_mask"]))
  assert (bins[0, 0, 16], bins[0, 16, 1], bins[0, 1, 15]) == (15, 14, 13)


# ------------------------------------------------------------------------------------------------
# The role registry (heads_jax.data.vocabulary.REGISTRY)

def test_registry_is_the_one_role_table():
  from heads_jax.data import vocabulary as V
  assert V.ROLES == tuple(r.name for r in V.REGISTRY) and len(set(V.ROLES)) == len(V.ROLES)
  assert V.SYNTACTIC_ROLES == ("nsubj", "obj", "amod", "advmod", "syntactic")
  assert V.COARSE_ROLES == {"local": ("local", "prev_local", "next_local"),
                            "syntactic": ("nsubj", "obj", "amod", "advmod", "syntactic"),
                            "delimiter": ("cls", "sep", "delimiter"), "block": ("block",)}
  assert V.GRID_ROLES == ("cls", "sep", "nsubj", "obj", "amod", "advmod", "prev_local",
                          "next_local", "block")
  assert V.PLAIN_TWINS == {"block": "block_plain"}
  assert V.role("syntactic").relations == (V.REL_NSUBJ, V.REL_OBJ, V.REL_AMOD, V.REL_ADVMOD)
  assert {r.kernel for r in V.REGISTRY} == set(V.KERNEL_CODES.values())
  for a, b in V.FINE_OVERLAPS + (V.SPEARMAN_ROLES,):
    assert a in V.ROLE_TABLE and b in V.ROLE_TABLE
  assert V.role_order(["obj", "zzz", "local", "obj"]) == ("local", "obj", "zzz")
  with pytest.raises(ValueError, match="unknown role 'nope'"):
    V.role("nope")


@pytest.mark.parametrize("kwargs, match", [
    (dict(sieve="ring"), "sieve kind must be one of"),
    (dict(group="vertical"), "group must be one of"),
    (dict(offsets=None), "offsets"),
    (dict(offsets=(2, 1)), "lo <= hi"),
    (dict(keys=("sep",)), "keys"),
    (dict(relations=(99,)), "relations"),
])
def test_registry_rows_are_checked(kwargs, match):
  from heads_jax.data import vocabulary as V
  base = dict(name="x", group=None, sieve=V.SIEVE_OFFSETS, color="#000", label="x", paper="x",
              offsets=(-1, 1))
  with pytest.raises(ValueError, match=match):
    V.Role(**{**base, **kwargs})


def test_a_new_registry_role_is_a_sieve(monkeypatch):
  """A role added to the registry alone is built by its kind and parameters."""
  from heads_jax.data import vocabulary as V
  monkeypatch.setitem(V.ROLE_TABLE, "wide", V.Role("wide", V.COARSE_LOCAL, V.SIEVE_OFFSETS,
                                                   "#000", "wide", "wide", offsets=(-4, 3)))
  monkeypatch.setitem(V.ROLE_TABLE, "nsubj_amod", V.Role(
      "nsubj_amod", V.COARSE_SYNTACTIC, V.SIEVE_RELATION, "#000", "n", "n",
      relations=(V.REL_NSUBJ, V.REL_AMOD)))
  rng = np.random.default_rng(11)
  batch = ref.random_batch(rng, 5, 9)
  for direction in ("dep2head", "both"):
    got = np.asarray(build_sieves(batch, ("wide", "nsubj_amod"), direction))
    for i in range(5):
      row = ref.row_of(batch, i)
      n = int(row["attention_mask"].sum())
      wide = [{x for x in range(t - 4, t + 4) if 0 <= x < n} for t in range(n)]
      rel = [a | b for a, b in zip(ref.sieve_sets(row, "nsubj", direction),
                                    ref.sieve_sets(row, "amod", direction))]
      for j, sets in enumerate((wide, rel)):
        want = np.zeros((9, 9), bool)
        for t, s in enumerate(sets):
          want[t, list(s)] = True
        np.testing.assert_array_equal(got[i, j], want)


def test_every_host_consumer_reads_the_role_registry():
  """Coarse roles, calibration's entropy-weighted roles and twins, the summary's overlaps and
  correlated roles, and the report's role table all come from the registry (a new role is one
  registry row)."""
  from heads_jax.data import vocabulary as V
  from heads_jax.hoststats import calibration, summary
  from heads_jax.hoststats import roles as hoststats_roles
  from heads_jax.report import style
  assert tuple(hoststats_roles.COARSE_ROLES) == V.COARSE_GROUPS and hoststats_roles.role_order is V.role_order
  # the registry's groups of fine roles (hoststats' fine-role union view)
  assert getattr(hoststats_roles, "FINE_UNION", hoststats_roles.COARSE_ROLES) is V.COARSE_ROLES
  assert calibration.ENTROPY_WEIGHTED is V.ENTROPY_WEIGHTED
  assert calibration.BLOCK_PLAIN is V.PLAIN_TWINS
  assert summary.FINE_OVERLAPS is V.FINE_OVERLAPS
  assert style.GRID_ROLES is V.GRID_ROLES
  assert style.ROLE_COLORS == {r.name: r.color for r in V.REGISTRY}
  assert style.ROLE_LABELS == {r.name: r.label for r in V.REGISTRY}
  assert set(style.GRID_MARKERS) == set(V.GRID_ROLES)
  assert style.COARSE_COLORS == V.COARSE_COLORS and list(style.COARSE_COLORS) == list(V.COARSE_GROUPS)
  # one marker shape per coarse role in the grid
  shape = {}
  for name in V.GRID_ROLES:
    assert shape.setdefault(V.role(name).group, style.GRID_MARKERS[name]) == style.GRID_MARKERS[name]
