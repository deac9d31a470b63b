"""Every claim of the two papers heads_jax reproduces, and how a run is judged against each.

Sources (full text in ``shared/papers/``, see its README; each claim quotes its sentence):

* `PANDE`: Pande et al., "The heads hypothesis", AAAI 2021 (``pande2021_heads_hypothesis.txt``)
  and the first author's blog post (`BLOG`, ``pande2021_blog.txt``): `pande`;
* `GUAN`: Guan et al., "How far does BERT look at", COLING 2020
  (``guan2020_how_far_does_bert_look_at.txt``): `guan`;
* `DEVLIN`: Devlin et al. 2019 (BERT-base GLUE scores the fine-tuned models are set beside):
  `devlin`.

The modules, one page each: `claim` (the `Claim` type, the verdicts, formatting), `pande`,
`guan` and `devlin` (the papers' claims and numbers), `run` (a run's analyses as the claims read
them), `pande_checks` and `guan_checks` (the rules of the statements), `judging` (`evaluate`:
a claim's figure, the number judge and the comparability gates). DESIGN.md section 3
("Verdicts") lists the rules; `evaluate` applies them to a run's analyses (`RunFigures`, built
by `heads_jax.report.reproduce`).

Verdicts: `HOLDS`, `FAILS` ("does not hold"), `NOT_COMPUTABLE` ("not computable here", with
the reason) or `NOT_COMPARABLE` (Guan et al.'s claims outside their setting: a GLUE run of other
models, or their numbers on another SQuAD model; the value is shown). Shares hold when the
paper's value lies in the 95% Wilson interval of this run's share over its heads / tests /
questions (``interval="wilson"``, `wilson_interval`); other numbers when within the claim's
``tolerance``; statements by their written rule, each of which a constructed run can fail
(tests/hoststats/test_paper_rules.py). EM and F1 are in percent, as the papers print them.

Layers. The papers number layers from 0 (Pande et al.: "block heads are prevalent in the zeroth
layer"); their layer ranges are BERT-base's 12 layers. For a model with L layers a layer range
a..b of BERT-base becomes the model layers at least half of whose depth share lies inside
[a/12, (b+1)/12) (`bert_base_layers`; identity for L = 12; for L = 6, "layers 6 to 8" are layers
3 and 4); such a verdict says "scaled".

Host-only package (numpy); no jax.
"""

from __future__ import annotations

from heads_jax.hoststats.claims import guan, pande
from heads_jax.hoststats.claims.claim import (  # noqa: F401 - the package's vocabulary
    ALPHA, BERT_BASE_LAYERS, BLOG, DEVLIN, FAILS, FIG2_GAP, FIG5_DELIMITER, FIG5_ROLES,
    FIG5_SYNTACTIC, GUAN, GUAN_SHAPE, HOLDS, KINDS, MODELS, NOT_COMPARABLE, NOT_COMPARABLE_MODEL,
    NOT_COMPUTABLE, PAIR_TASKS, PANDE, PANDE_METHOD_CLAIMS, PAPER_FILES, PAPER_MODELS, UNDECIDED,
    PAPER_ROLES, PAPERS, SCOPES, SETTINGS, STABLE_BAR, TASK_NAMES, TASKS, VERDICTS, Z95, Claim,
    difference, format_difference, format_paper_value, format_value, wilson_interval)
from heads_jax.hoststats.claims.devlin import DEVLIN_DEV, DevScore, devlin_dev  # noqa: F401
from heads_jax.hoststats.claims.guan import (  # noqa: F401
    CLUSTER_TYPES, GUAN_TABLE2, GUAN_TABLE3, GUAN_TASKS)
from heads_jax.hoststats.claims.judging import evaluate, evaluate_all  # noqa: F401
from heads_jax.hoststats.claims.pande import PANDE_SETUP  # noqa: F401
from heads_jax.hoststats.claims.run import (  # noqa: F401
    Analysis, Evaluation, NotComputable, RunFigures, beats_majority, bert_base_layers,
    pande_setting, unnamed_types)

CLAIMS: tuple[Claim, ...] = pande.CLAIMS + guan.CLAIMS


def claims(paper: str | None = None) -> tuple[Claim, ...]:
  """All claims, or those of one paper (`PANDE`, `BLOG`, `GUAN`)."""
  return tuple(c for c in CLAIMS if paper is None or c.paper == paper)


def claim(key: str) -> Claim:
  for c in CLAIMS:
    if c.key == key:
      return c
  raise KeyError(f"no claim {key!r}; claims: {', '.join(c.key for c in CLAIMS)}")
