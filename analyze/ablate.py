"""Ablate attention heads of a fine-tuned classifier: groups, intra/inter attention, importance,
pruning; which heads carry the prediction (attribution, patching).

Evaluates the classifier on its GLUE dev set with groups of heads removed (gate 0) or replaced
by uniform attention (--by cluster|role|layer|heads; Guan et al. 2020 Table 2), with the
intra- or inter-sentence attention of chosen heads removed (--cross; Guan et al. Table 3), and
computes head importance and the pruning curve (--importance, --prune; Michel et al. 2019),
self-attention attribution (--attribution; Hao et al. 2021) and activation patching per head
(--patching), beside the roles of --analysis.
Each ablation is compared with random groups of the same layers (none for a group of whole
layers). Writes into --out: ablation.csv,
segment_ablation.csv, importance.csv, pruning.csv, pruning_summary.csv, ablation.json,
figures/*.png and report.html. Thin entry point over ``heads_jax.pipelines.ablate.run_ablation``.
"""

from __future__ import annotations

import dataclasses
from heads_jax.cli import add_redo
from heads_jax.pipelines import names


def add_args(p):
  p.add_argument("--model", required=True, help="fine-tuned classifier: a heads_jax model directory "
                 "(e.g. a fine-tuning run's best_model) or a Hugging Face BertForSequenceClassification")
  p.add_argument("--data", required=True, metavar="SPEC",
                 help="labelled GLUE data: glue-tsv:DIR/TASK[:SPLIT] | glue:TASK[:SPLIT] (TFDS) | sst2 | mrpc")
  p.add_argument("--task", default=None, help="GLUE task (default: the data's)")
  p.add_argument("--finetune-data", default=None, metavar="PATH",
                 help="a fine-tuning run's data.json (or work directory): evaluate only on the rows "
                      "it held out for evaluation (when it trained on part of the same split)")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--analysis", default=None, metavar="DIR",
                 help="output directory of `heads-jax analyze` on this model (clusters.csv, tests.csv)")
  p.add_argument("--by", default=None, metavar="GROUPING",
                 help="ablate groups of heads: by cluster type (cluster; cluster-pairs: every union of "
                      "two types; cluster-all-but-one: every type but one; Guan et al. Tables 2-3), "
                      "assigned role (role), layer (layer), or the --heads groups (heads)")
  p.add_argument("--role-level", choices=("coarse", "fine"), default="coarse",
                 help="--by role: coarse roles + unskilled (default) or every fine role")
  p.add_argument("--mode", choices=("remove", "uniform", "mean"), default="remove",
                 help="remove: gate 0 (default); uniform: attention replaced by uniform over real "
                      "tokens; mean: each head's output replaced by its mean over the data")
  p.add_argument("--random-groups", type=int, default=30,
                 help="--by role: the causal test of each role against this many random groups with "
                      "the same heads per layer (permutation p-value; default 30, 0: off)")
  p.add_argument("--heads", default=None, metavar="L:H,...",
                 help="heads for --by heads or --cross: 'L:H,L:H' (L:* = a whole layer); several "
                      "groups separated by ';', each optionally NAME=L:H,...")
  p.add_argument("--cross", choices=("intra", "inter", "both"), default=None,
                 help="remove the intra- or inter-sentence attention of the --cluster heads (or --heads)")
  p.add_argument("--cluster", action="append", default=None, metavar="TYPE",
                 help="cluster type(s) for --cross (repeat; default: every type in --analysis)")
  p.add_argument("--renormalise", action="store_true",
                 help="--cross: renormalise attention rows after the removal (default: not, as the paper)")
  p.add_argument("--paper-tables", action="store_true",
                 help="Guan et al. Tables 2-3 row by row (types from --analysis), the paper's values "
                      "beside; on a SQuAD model (--data squad:FILE, --max-length 384) in EM/F1")
  p.add_argument("--importance", action="store_true", help="compute head importance (Michel et al.)")
  p.add_argument("--prune", action="store_true", help="pruning curve by importance vs random (implies --importance)")
  p.add_argument("--prune-step", type=float, default=0.1, help="share of heads pruned per step (default 0.1; e.g. 0.05)")
  p.add_argument("--prune-max", type=float, default=1.0, help="largest share pruned (default 1.0)")
  p.add_argument("--prune-once", action="store_true",
                 help="order heads by the full model's importance once (default: re-estimate after each step, as Michel et al.)")
  p.add_argument("--importance-per-batch", action="store_true",
                 help="|gradient of each batch's mean loss| (the authors' code) instead of per-example |gradients|")
  p.add_argument("--no-layer-norm", dest="layer_norm", action="store_false",
                 help="do not divide each layer's importance by its L2 norm (default: divide, as Michel et al.'s code)")
  p.add_argument("--importance-data", default=None, metavar="SPEC",
                 help="estimate importance on other labelled data (default: the --data set)")
  g = p.add_argument_group("which heads carry the prediction (issue 51)")
  g.add_argument("--attribution", action="store_true",
                 help="self-attention attribution of every head (Hao et al. 2021): integrated "
                      "gradients of the predicted class's score w.r.t. each layer's attention maps; "
                      "with --prune the pruning curves by attribution, Michel importance, role "
                      "and at random on held-out rows (in place of --prune's importance-only curve)")
  g.add_argument("--patching", action="store_true",
                 help="activation patching of every head (corrupted output into the clean run) "
                      "and attribution patching beside it")
  g.add_argument("--steps", type=int, default=20, help="--attribution: Riemann steps m (default 20: Hao et al.'s m as issue 51 "
                      "states it; their text is not in shared/papers)")
  g.add_argument("--objective", choices=("probability", "log_probability", "logit"),
                 default="probability",
                 help="--attribution: F, the predicted class's probability (default, as the authors' code), log-probability or logit")
  g.add_argument("--corrupt", choices=("mask", "swap", "tsv"), default=None,
                 help="--patching: corrupted rows by masking tokens (default for single sentences), "
                      "swapping the second sentence with another row's (default for pairs) or from --corrupted")
  g.add_argument("--corrupt-share", type=float, default=0.5, help="--corrupt mask: share of tokens masked (default 0.5)")
  g.add_argument("--corrupted", default=None, metavar="TSV",
                 help="--corrupt tsv: one corrupted row per evaluation row, same order, columns "
                      "sentence (or sentence1, sentence2), the same token length as its clean row")
  g.add_argument("--attribution-examples", type=int, default=None, metavar="N",
                 help="rows for attribution, patching and the pruning orders' importance (default: "
                      "the first half); the rest are the pruning curves' held-out rows")
  g.add_argument("--maps", type=int, default=4,
                 help="rows whose token-to-token attribution maps are kept (attribution_maps.npy; default 4)")
  p.add_argument("--random-seeds", type=int, default=3, help="random groups of the same layers (tables) / random pruning orders per comparison (default 3)")
  p.add_argument("--seed", type=int, default=0, help="first random seed (default 0)")
  p.add_argument("--max-examples", type=int, default=None, help="first N examples of the data")
  p.add_argument("--max-length", type=int, default=128, help="wordpieces per example (default 128)")
  p.add_argument("--doc-stride", type=int, default=128,
                 help="SQuAD data: stride of the windows over a context (default 128, as run_squad.py)")
  p.add_argument("--batch-size", type=int, default=64, help="examples per device step (default 64)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="compute dtype override")
  p.add_argument("--title", default=None, help="report title")
  add_redo(p, names.ABLATE)
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def to_config(args):
  """The parsed flags as the library's config (every flag but --debug is a field)."""
  from heads_jax.pipelines.ablate import AblationConfig
  fields = {f.name for f in dataclasses.fields(AblationConfig)}
  return AblationConfig(**{k: v for k, v in vars(args).items() if k in fields})


def main(args):
  from heads_jax.ablation.groups import GROUPINGS
  from heads_jax.errors import UserError
  from heads_jax.pipelines.ablate import run_ablation
  if args.by is not None and args.by not in GROUPINGS:
    raise UserError(f"--by {args.by}: choose one of {', '.join(GROUPINGS)}")
  run_ablation(to_config(args), redo=args.redo)
