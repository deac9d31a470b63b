"""Guan et al. 2020 Tables 2 and 3, row by row, on an evaluator (a SQuAD span model's
``evaluate.SquadEvaluator``: exact match and F1, the tables' "Acc. F1" columns on "SQuAD v1.1";
a GLUE ``Evaluator`` works too),
with the paper's values beside this run's.

The paper's settings (``heads_jax.hoststats.claims.GUAN_TABLE2`` / ``GUAN_TABLE3``; the check and
cross marks of the extracted text are its "3" and "7"):

* Table 2 (section 5.1: "We mask the attention value to 0 or substitute it with an uniformed
  attention value of 1/L"): each type kept, ``pruned`` (the heads' attention set to 0: gate 0,
  ``gate_mode="remove"``) or ``1/L`` (uniform attention over the L real tokens:
  ``gate_mode="uniform"``); rows 2-5 prune one type, 6-7 two types, 8-11 substitute one type.
* Table 3 (section 5.2: "We constrain attention matrix by sentences and remove the
  intra-sentence attention or inter-sentence attention"): per type, the intra- and/or
  inter-sentence attention removed (``segment_removal``; rows not renormalised: the paper does not say, see ``ablation.ablate``);
  for SQuAD the two "sentences" are the question and the context. Rows 12-15 remove one part of
  one type; 16-19 remove one part of every type but one ("ablating all type but remaining one
  type", Table 3 caption).

A type that the run's clustering did not produce (no heads of that name) leaves its rows
computed without it and marked in ``missing_types``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from heads_jax.ablation.groups import SEGMENT_PARTS, HeadGroup, gate_for
from heads_jax.errors import UserError
from heads_jax.hoststats import claims as paper
from heads_jax.report.ablation import value_text

TYPES = paper.CLUSTER_TYPES   # dense, diagonal, dense+vertical, vertical (the tables' columns)


def _heads_by_type(groups) -> dict[str, tuple]:
  by = {g.name: tuple(g.heads) for g in groups if isinstance(g, HeadGroup)}
  if not any(by.get(t) for t in TYPES):
    raise UserError(f"none of the cluster types {TYPES} has heads in the analysis (types: "
                    f"{sorted(by)}): Guan et al.'s tables need the K = 4 clustering's types")
  return {t: by.get(t, ()) for t in TYPES}


def table2_settings() -> list[dict]:
  """The rows of Table 2: ``id``, ``setting`` (per type: kept, pruned, 1/L), the paper's EM and
  F1 (percent)."""
  return [{"id": i, "setting": dict(zip(TYPES, types)), "paper_exact_match": em, "paper_f1": f1}
          for i, types, em, f1 in paper.GUAN_TABLE2]


def table3_settings() -> list[dict]:
  """The rows of Table 3: ``id``, ``setting`` (per type: (intra kept, inter kept)), the paper's
  EM and F1 (percent)."""
  return [{"id": i, "setting": dict(zip(TYPES, types)), "paper_exact_match": em, "paper_f1": f1}
          for i, types, em, f1 in paper.GUAN_TABLE3]


def _describe2(setting: dict) -> str:
  parts = [f"{t} {s}" for t, s in setting.items() if s != "kept"]
  return "; ".join(parts) or "baseline"


def _describe3(setting: dict) -> str:
  parts = []
  for t, kept in setting.items():
    gone = [p for p, k in zip(SEGMENT_PARTS, kept) if not k]
    if gone:
      parts.append(f"{t} {'+'.join(gone)} removed")
  return "; ".join(parts)


def table2_inputs(setting: dict, heads: dict, L: int, H: int) -> dict:
  """The evaluator keywords of one Table 2 row: ``head_gate`` ``[l, h]`` and ``gate_mode``."""
  modes = {s for s in setting.values() if s != "kept"}
  if len(modes) > 1:
    raise ValueError(f"a row mixes pruning and substitution: {setting}")
  chosen = [h for t, s in setting.items() if s != "kept" for h in heads[t]]
  mode = "uniform" if modes == {"1/L"} else "remove"
  return {"head_gate": gate_for(chosen, L, H), "gate_mode": mode}


def table3_inputs(setting: dict, heads: dict, L: int, H: int) -> dict:
  """The evaluator keyword of one Table 3 row: ``segment_removal`` ``[l, h, 2]`` (1 where the
  part is removed)."""
  removal = np.zeros((L, H, 2), np.float32)
  for t, kept in setting.items():
    for part, k in enumerate(kept):
      if not k:
        for l, h in heads[t]:
          removal[l, h, part] = 1.0
  return {"segment_removal": removal}


def _row(evaluator, table: int, spec: dict, inputs: dict, heads: dict, base: dict,
         describe) -> dict:
  metrics = evaluator.evaluate(**inputs)
  cols = tuple(getattr(evaluator, "metric_columns", ("accuracy", "f1")))
  touched = [t for t, s in spec["setting"].items()
             if (s != "kept" if table == 2 else not all(s))]
  row = {"table": table, "id": spec["id"], "setting": describe(spec["setting"]),
         "num_heads": int(sum(len(heads[t]) for t in touched)),
         "missing_types": ", ".join(t for t in touched if not heads[t])}
  for m in cols:
    if m == "loss":
      continue
    row[m] = metrics[m]
    row[f"{m}_change"] = metrics[m] - base[m]
  row["paper_exact_match"] = spec["paper_exact_match"] / 100
  row["paper_f1"] = spec["paper_f1"] / 100
  return row


def paper_tables(evaluator, groups, *, base: dict | None = None, log=None) -> pd.DataFrame:
  """Every row of Guan et al. Tables 2 (ids 1-11) and 3 (ids 12-19) on ``evaluator``, the heads
  of each type from ``groups`` (``groups.cluster_groups`` of the run's clustering).

  Columns: table, id, setting, num_heads (heads touched), missing_types, this run's metrics
  (``exact_match``, ``f1`` for SQuAD; fractions) and their change against the unablated model,
  ``paper_exact_match`` and ``paper_f1`` (the paper's, as fractions).
  """
  log = log or (lambda *_: None)
  heads = _heads_by_type(groups)
  L, H = evaluator.num_layers, evaluator.num_heads
  base = base or evaluator.evaluate()
  rows = []
  for spec in table2_settings():
    inputs = table2_inputs(spec["setting"], heads, L, H)
    rows.append(_row(evaluator, 2, spec, inputs, heads, base, _describe2))
    log(f"Table 2 row {spec['id']} ({rows[-1]['setting']}): " + _scores(rows[-1]))
  for spec in table3_settings():
    inputs = table3_inputs(spec["setting"], heads, L, H)
    rows.append(_row(evaluator, 3, spec, inputs, heads, base, _describe3))
    log(f"Table 3 row {spec['id']} ({rows[-1]['setting']}): " + _scores(rows[-1]))
  return pd.DataFrame(rows)


def _scores(row: dict) -> str:
  """A row's scores for the log, in the one unit of the ablation (`report.ablation.value_text`):
  "exact_match 12.34%, f1 23.45% (paper 82.85%, 89.68%)"."""
  em = "exact_match" if "exact_match" in row else "accuracy"
  return (f"{em} {value_text(em, row[em])}, f1 {value_text('f1', row.get('f1', float('nan')))} "
          f"(paper {value_text(em, row['paper_exact_match'])}, "
          f"{value_text('f1', row['paper_f1'])})")
