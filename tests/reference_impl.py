"""Independent plain-python/numpy reference of the sieves and statistics (DESIGN.md section 3).

Written from the formulas with explicit loops and python sets, sharing no code with
``heads_jax.sieves`` / ``heads_jax.stats`` (only the batch constants), so tests can compare
the two. Slow by design: tiny shapes only. Also random encoded batches and attention for tests.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from heads_jax.data import vocabulary as B

RELATION_IDS = {"nsubj": B.REL_NSUBJ, "obj": B.REL_OBJ, "amod": B.REL_AMOD, "advmod": B.REL_ADVMOD}
SPECIAL_FEATURE = {B.TOKEN_CLS: 17, B.TOKEN_SEP: 18, B.TOKEN_COMMA: 19, B.TOKEN_PERIOD: 20}


def sieve_sets(row: dict, role: str, direction: str = "dep2head") -> list[set]:
  """S(t) for t = 0..n-1 of one sequence (``row``: batch fields of one sequence, [k])."""
  n = int(np.sum(row["attention_mask"]))
  tt, tc = row["token_type_ids"], row["token_class"]
  wid, head, rel = row["word_ids"], row["dep_head"], row["dep_rel"]
  out = []
  for t in range(n):
    if role == "local":
      s = {x for x in range(t - 2, t + 3) if 0 <= x < n}
    elif role == "prev_local":
      s = {x for x in (t - 2, t - 1) if 0 <= x < n}
    elif role == "next_local":
      s = {x for x in (t + 1, t + 2) if 0 <= x < n}
    elif role in ("block", "block_plain"):
      is_pair = any(tt[x] == 1 for x in range(n))
      s = set()
      if is_pair:
        s = {x for x in range(n) if tt[x] == tt[t] and tc[x] not in (B.TOKEN_CLS, B.TOKEN_SEP)}
    elif role == "cls":
      s = {0}
    elif role == "sep":
      s = {x for x in range(n) if tc[x] == B.TOKEN_SEP}
    elif role == "delimiter":
      s = {0} | {x for x in range(n) if tc[x] == B.TOKEN_SEP}
    elif role in RELATION_IDS or role == "syntactic":
      rels = RELATION_IDS.values() if role == "syntactic" else [RELATION_IDS[role]]
      s = set()
      for r in rels:
        if rel[t] == r and head[t] >= 0:
          s |= {x for x in range(n) if wid[x] == head[t]}
        if direction == "both" and wid[t] >= 0:
          s |= {x for x in range(n) if rel[x] == r and head[x] >= 0 and head[x] == wid[t]}
    else:
      raise ValueError(role)
    out.append(s)
  return out


def row_of(batch: dict, i: int) -> dict:
  return {f: np.asarray(v)[i] for f, v in batch.items()}


def token_biases(alpha: np.ndarray, sets: list[set], block: bool) -> list:
  """beta(t) per query (None where S(t) is empty); ``alpha`` [q, k] of one head."""
  n = len(sets)
  out = []
  for t in range(n):
    if not sets[t]:
      out.append(None)
      continue
    num = sum(alpha[t, s] for s in sets[t]) / len(sets[t])
    den = sum(alpha[t, s] for s in range(n)) / n
    beta = num / den
    if block:
      beta *= scipy.stats.entropy(alpha[t, :n])
    out.append(beta)
  return out


def sieve_bias(attn: np.ndarray, batch: dict, roles, direction: str = "dep2head") -> np.ndarray:
  """float64 ``[b, l, h, r]`` from ``attn`` ``[b, l, h, q, k]``; NaN where no query has a sieve."""
  b, l, h = attn.shape[:3]
  out = np.full((b, l, h, len(roles)), np.nan)
  for i in range(b):
    row = row_of(batch, i)
    for j, role in enumerate(roles):
      sets = sieve_sets(row, role, direction)
      for li in range(l):
        for hi in range(h):
          vals = [v for v in token_biases(attn[i, li, hi], sets, role == "block") if v is not None]
          if vals:
            out[i, li, hi, j] = float(np.mean(vals))
  return out


def query_distance(alpha: np.ndarray, token_class, n: int, t: int) -> np.ndarray:
  """The 21 distance features of query t (``alpha`` [q, k] of one head)."""
  f = np.zeros(21)
  for s in range(n):
    if s == t:
      f[16] += alpha[t, s]
    elif token_class[s] in SPECIAL_FEATURE:
      f[SPECIAL_FEATURE[token_class[s]]] += alpha[t, s]
    else:
      d = abs(s - t)
      f[min(15, (16 * d) // n)] += alpha[t, s]
  return f


def distance_features(attn: np.ndarray, batch: dict) -> np.ndarray:
  """float64 ``[b, l, h, 21]``: mean over real queries."""
  b, l, h = attn.shape[:3]
  out = np.zeros((b, l, h, 21))
  for i in range(b):
    n = int(np.sum(batch["attention_mask"][i]))
    tc = batch["token_class"][i]
    for li in range(l):
      for hi in range(h):
        if n:
          out[i, li, hi] = np.mean([query_distance(attn[i, li, hi], tc, n, t) for t in range(n)], axis=0)
  return out


# ----------------------------------------------------------------------------------------------
# Random test inputs.

def random_batch(rng: np.random.Generator, b: int, k: int, min_len: int = 1,
                 pair_prob: float = 0.5, rel_prob: float = 0.5) -> dict:
  """A random but well-formed encoded batch ``[b, k]``: singles and pairs, words of 1-3
  wordpieces, commas/periods, dependency arcs (some with the four relations), padding."""
  batch = B.empty_batch(b, k)
  for i in range(b):
    n = int(rng.integers(min_len, k + 1))
    pair = n >= 5 and rng.random() < pair_prob
    classes = [B.TOKEN_CLS]
    types = [0]
    if pair:
      sep1 = int(rng.integers(2, n - 2))        # [CLS] A(1..sep1-1) [SEP] B [SEP]
      seps = {sep1, n - 1}
    else:
      seps = {n - 1} if n >= 2 else set()
    seg = 0
    for t in range(1, n):
      if t in seps:
        classes.append(B.TOKEN_SEP)
      else:
        classes.append(int(rng.choice([B.TOKEN_OTHER] * 6 + [B.TOKEN_COMMA, B.TOKEN_PERIOD])))
      types.append(seg)
      if pair and t == min(seps):
        seg = 1
    words, w, left = [], -1, 0
    for t in range(n):
      if classes[t] in (B.TOKEN_CLS, B.TOKEN_SEP):
        words.append(-1)
        left = 0
        continue
      if left == 0:
        w += 1
        left = int(rng.integers(1, 4))
      words.append(w)
      left -= 1
    num_words = w + 1
    heads = np.full(num_words, -1)
    rels = np.zeros(num_words, int)
    for x in range(num_words):
      if num_words > 1 and rng.random() < 0.8:
        heads[x] = int(rng.choice([y for y in range(num_words) if y != x]))
        rels[x] = int(rng.integers(1, 5)) if rng.random() < rel_prob else B.REL_NONE
    batch["attention_mask"][i, :n] = 1
    batch["input_ids"][i, :n] = rng.integers(1000, 2000, n)
    batch["token_class"][i, :n] = classes
    batch["token_type_ids"][i, :n] = types
    batch["word_ids"][i, :n] = words
    for t in range(n):
      if words[t] >= 0:
        batch["dep_head"][i, t] = heads[words[t]]
        batch["dep_rel"][i, t] = rels[words[t]]
  return batch


def random_attention(rng: np.random.Generator, attention_mask: np.ndarray, l: int, h: int,
                     junk: bool = True, scale: float = 2.0) -> np.ndarray:
  """float32 ``[b, l, h, q, k]``: random softmax rows over the real keys; with ``junk``, padding
  query rows hold random positive values (they must be ignored)."""
  mask = np.asarray(attention_mask).astype(bool)
  b, k = mask.shape
  logits = rng.normal(size=(b, l, h, k, k)) * scale
  logits = np.where(mask[:, None, None, None, :], logits, -np.inf)
  with np.errstate(invalid="ignore"):
    e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    a = e / e.sum(-1, keepdims=True)
  a = np.nan_to_num(a)
  pad_q = ~mask[:, None, None, :, None]
  if junk:
    a = np.where(pad_q, rng.random(a.shape), a)
  else:
    a = np.where(pad_q, 0.0, a)
  return a.astype(np.float32)
