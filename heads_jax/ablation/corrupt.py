"""Corrupted rows for activation patching, built from the clean rows (host only).

Patching writes a head's output at position q of the corrupted run into position q of the
clean run, so every corrupted row keeps its clean row's positions: the same length, the special
tokens ([CLS], [SEP]) and the token types where they are.

* ``mask``: each real, non-special token replaced by the tokenizer's mask token with
  probability ``share`` (at least one token of each row; seeded): the information of the words
  removed, the template kept;
* ``swap``: for sentence pairs, the second sentence's tokens (token type 1, its final
  separator kept) replaced by another row's second sentence, that of the row whose second
  sentence has the nearest token count (ties: the next row), fitted to the clean length (cut,
  or filled with mask tokens): a well-formed pair whose sentences do not belong together;
* ``tsv``: the user's own corrupted rows, a TSV with a header and one row per clean row in the
  same order, its text columns ``sentence`` (single sentences) or ``sentence1``, ``sentence2``
  (pairs), encoded with the model's tokenizer; a row whose token count differs from its clean
  row is refused (`heads_jax.ablation.patching.check_pairs`).

Arrays: ``input_ids``, ``attention_mask``, ``token_type_ids`` int32 ``[n, k]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from heads_jax.errors import UserError

CORRUPTIONS = ("mask", "swap", "tsv")
DEFAULT_SHARE = 0.5


def _special(ids, tokenizer) -> np.ndarray:
  return np.isin(ids, np.asarray(sorted(set(tokenizer.all_special_ids)), ids.dtype))


def mask_tokens(data: dict, tokenizer, *, share: float = DEFAULT_SHARE, seed: int = 0) -> dict:
  """``data`` with each real non-special token replaced by the mask token with probability
  ``share`` (at least one per row)."""
  if not 0 < share <= 1:
    raise UserError(f"--corrupt-share {share}: give the share of tokens masked, above 0 and at "
                    "most 1")
  if tokenizer.mask_token_id is None:
    raise UserError("the tokenizer has no mask token: use --corrupt swap (pairs) or tsv")
  ids = np.array(data["input_ids"])
  words = (np.asarray(data["attention_mask"]) > 0) & ~_special(ids, tokenizer)
  rng = np.random.default_rng(seed)
  pick = words & (rng.random(ids.shape) < share)
  for i in np.flatnonzero(~pick.any(1) & words.any(1)):   # at least one token per row
    pick[i, rng.choice(np.flatnonzero(words[i]))] = True
  ids[pick] = tokenizer.mask_token_id
  return {**data, "input_ids": ids}


def swap_second(data: dict, tokenizer) -> dict:
  """``data`` (sentence pairs) with each row's second sentence replaced by another row's
  (module docstring)."""
  ids = np.asarray(data["input_ids"])
  types = np.asarray(data["token_type_ids"])
  real = np.asarray(data["attention_mask"]) > 0
  second = (types == 1) & real & ~_special(ids, tokenizer)
  counts = second.sum(1)
  if not counts.any():
    raise UserError("--corrupt swap replaces the second sentence of sentence pairs; this data "
                    "has single sentences (or no token types): use --corrupt mask or tsv")
  if len(ids) < 2:
    raise UserError("--corrupt swap needs at least 2 rows (a row's second sentence comes from "
                    "another row)")
  out = ids.copy()
  n = len(ids)
  for i in range(n):
    others = np.asarray([j for j in range(n) if j != i])
    gap = np.abs(counts[others] - counts[i])
    near = others[gap == gap.min()]
    j = int(near[near > i][0] if (near > i).any() else near[0])
    donor = ids[j][second[j]]
    slots = np.flatnonzero(second[i])
    fill = np.full(len(slots), tokenizer.mask_token_id if tokenizer.mask_token_id is not None
                   else tokenizer.unk_token_id, ids.dtype)
    fill[:min(len(slots), len(donor))] = donor[:len(slots)]
    out[i, slots] = fill
  return {**data, "input_ids": out}


def read_tsv(path, tokenizer, *, pair: bool, max_length: int) -> dict:
  """The corrupted rows of the TSV ``path`` (module docstring), encoded."""
  from heads_jax.data.glue_batches import encode_texts
  path = Path(path)
  if not path.is_file():
    raise UserError(f"--corrupted {path} does not exist: give a TSV of corrupted rows")
  try:
    table = pd.read_csv(path, sep="\t", quoting=3, dtype=str, keep_default_na=False)
  except (ValueError, OSError) as e:
    raise UserError(f"--corrupted {path} cannot be read as a TSV ({type(e).__name__})") from None
  need = ("sentence1", "sentence2") if pair else ("sentence",)
  missing = [c for c in need if c not in table.columns]
  if missing:
    raise UserError(f"--corrupted {path} has no column {', '.join(missing)} (its header: "
                    f"{', '.join(map(str, table.columns))}); give " + " and ".join(need))
  b = list(table["sentence2"]) if pair else None
  a = list(table[need[0]])
  return encode_texts(tokenizer, a, b, max_length=max_length, pad_to_max_length=False)


def corrupted_rows(data: dict, tokenizer, how: str, *, share: float = DEFAULT_SHARE,
                   seed: int = 0, tsv=None, pair: bool = False, max_length: int = 128) -> dict:
  """The corrupted rows of ``data`` by ``how`` (`CORRUPTIONS`), padded to ``data``'s width."""
  if how == "mask":
    return mask_tokens(data, tokenizer, share=share, seed=seed)
  if how == "swap":
    return swap_second(data, tokenizer)
  if how == "tsv":
    if tsv is None:
      raise UserError("--corrupt tsv needs --corrupted FILE (a TSV of corrupted rows)")
    enc = read_tsv(tsv, tokenizer, pair=pair, max_length=max_length)
    width = np.asarray(data["input_ids"]).shape[1]
    out = {}
    for k in ("input_ids", "attention_mask", "token_type_ids"):
      a = np.asarray(enc[k])[:, :width]
      out[k] = np.pad(a, ((0, 0), (0, width - a.shape[1])))
    return out
  raise UserError(f"--corrupt {how}: choose one of {', '.join(CORRUPTIONS)}")
