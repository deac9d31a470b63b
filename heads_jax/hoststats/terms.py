"""DeBERTa's attention terms per head, summarised for summary.json and the report (no jax).

``measures.npz`` of a DeBERTa analysis holds ``term_shares`` float32 ``[b, l, h, 3]``: for each
sequence, layer and head, the share of the variance of the head's attention logits over the keys
that comes from the content-to-content, content-to-position and position-to-content terms
(``term_names``; docs/DESIGN.md section 3, "DeBERTa-v3"; computed by
``heads_jax.model.deberta``). ``term_share_summary`` averages them over the sequences and names
the positional heads: those whose two positional terms together carry more than half of the
logits' variance (``POSITIONAL_SHARE``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

POSITIONAL_SHARE = 0.5
POSITIONAL_TERMS = ("c2p", "p2c")


def mean_term_shares(term_shares) -> np.ndarray:
  """float64 ``[l, h, 3]``: the shares' mean over the sequences that have them (a one-token
  sequence has none: NaN); NaN where no sequence has them."""
  shares = np.asarray(term_shares, np.float64)
  if shares.ndim != 4:
    raise ValueError(f"term_shares must be [b, l, h, terms], got shape {shares.shape}")
  ok = np.isfinite(shares).all(-1, keepdims=True)
  n = ok.sum(0)
  total = np.where(ok, shares, 0.0).sum(0)
  return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def term_share_summary(term_shares, names: Sequence[str]) -> dict:
  """summary.json's ``term_shares`` entry: ``terms`` (the names), ``per_head`` ``[l][h][3]`` and
  ``per_layer`` ``[l][3]`` means (over the sequences; then over the heads), ``positional_heads``
  ("layer:head" whose mean c2p + p2c share exceeds ``POSITIONAL_SHARE``), ``content_heads`` (the
  others with a finite share), and ``num_sequences``."""
  names = tuple(str(x) for x in names)
  per_head = mean_term_shares(term_shares)
  if per_head.shape[-1] != len(names):
    raise ValueError(f"term_shares has {per_head.shape[-1]} terms but names lists {len(names)}")
  positional = per_head[..., [names.index(t) for t in POSITIONAL_TERMS if t in names]].sum(-1)
  l, h = positional.shape
  heads = [(i, j) for i in range(l) for j in range(h) if np.isfinite(positional[i, j])]
  return {
      "terms": list(names),
      "num_sequences": int(np.asarray(term_shares).shape[0]),
      "per_head": _rounded(per_head),
      "per_layer": _rounded(np.nanmean(per_head, axis=1) if h else per_head[:, 0]),
      "positional_share_threshold": POSITIONAL_SHARE,
      "positional_heads": [f"{i}:{j}" for i, j in heads if positional[i, j] > POSITIONAL_SHARE],
      "content_heads": [f"{i}:{j}" for i, j in heads if positional[i, j] <= POSITIONAL_SHARE],
  }


def _rounded(a: np.ndarray) -> list:
  """Nested lists of floats rounded to 4 decimals, None for NaN (strict JSON)."""
  return np.vectorize(lambda v: None if not np.isfinite(v) else round(float(v), 4),
                      otypes=[object])(a).tolist()
