"""Devlin et al. 2019: the BERT-base GLUE scores the fine-tuned models are set beside."""

from __future__ import annotations

import dataclasses

from heads_jax.hoststats.claims.claim import DEVLIN


@dataclasses.dataclass(frozen=True)
class DevScore:
  """A published BERT-base GLUE score of one task."""
  task: str
  metric: str          # "accuracy" or "f1"
  value: float | None  # a fraction 0..1; None when the paper does not give it
  split: str           # "dev" or "test"
  source: str
  note: str = ""


# Devlin et al. report BERT-base dev scores only in their ablations (Table 5: MNLI-m, QNLI,
# MRPC, SST-2 accuracy on dev); QQP dev is not given. Table 1 gives GLUE test scores (F1 for QQP
# and MRPC, accuracy otherwise).
DEVLIN_DEV: dict[str, tuple[DevScore, ...]] = {
    "mrpc": (DevScore("mrpc", "accuracy", 0.867, "dev", f"{DEVLIN}, Table 5 (and Table 6, 12/768/12)"),
             DevScore("mrpc", "f1", 0.889, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "qqp": (DevScore("qqp", "f1", None, "dev", DEVLIN,
                     note="Devlin et al. give no QQP dev score for BERT-base"),
            DevScore("qqp", "f1", 0.712, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "sst2": (DevScore("sst2", "accuracy", 0.927, "dev", f"{DEVLIN}, Table 5"),
             DevScore("sst2", "accuracy", 0.935, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
    "qnli": (DevScore("qnli", "accuracy", 0.884, "dev", f"{DEVLIN}, Table 5"),
             DevScore("qnli", "accuracy", 0.905, "test", f"{DEVLIN}, Table 1 (GLUE test server)")),
}


def devlin_dev(task: str, metric: str | None = None) -> DevScore | None:
  """Devlin et al.'s BERT-base dev score of ``task`` (the first with ``metric`` if given)."""
  for s in DEVLIN_DEV.get(task, ()):
    if s.split == "dev" and (metric is None or s.metric == metric):
      return s
  return None

