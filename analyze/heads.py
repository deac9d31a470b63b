"""Analyse the attention heads of an encoder (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT): sieve bias, hypothesis tests, roles, clusters, report.

Writes into --out: scores.npz, tests.csv + tests.json, summary.json, clusters.csv, figures/*.png
and report.html (DESIGN.md section 4), and prints the roles per layer. Thin entry point over
``heads_jax.pipelines.analyze.run_analysis``.
"""

from __future__ import annotations

import argparse



def _tau(s: str):
  if s == "auto":
    return s
  try:
    return float(s)
  except ValueError:
    raise argparse.ArgumentTypeError(f"must be a number or 'auto', got {s!r}") from None
from heads_jax.cli import add_redo
from heads_jax.pipelines import names


def add_args(p):
  p.add_argument("--model", required=True, help="a Hugging Face model directory (BERT, RoBERTa, XLM-RoBERTa, "
                                                 "DistilBERT, ELECTRA, ALBERT), a hub id found in the local Hugging "
                                                 "Face cache (HF_HOME; downloaded unless HF_HUB_OFFLINE=1), or a "
                                                 "heads_jax model directory (a local path or gs://...)")
  p.add_argument("--data", required=True, action="append", metavar="SPEC",
                 help="conllu:FILE | glue:TASK[:SPLIT] (TFDS) | glue-tsv:DIR/TASK[:SPLIT] | tsv:FILE[:header] | "
                      "text:FILE | ud-ewt | sst2 | mrpc (embedded); repeat to analyse several data sets together")
  p.add_argument("--out", required=True, help="output directory (a local path or gs://...)")
  p.add_argument("--max-examples", type=int, default=None, help="first N examples of each data set")
  p.add_argument("--max-length", type=int, default=128, help="wordpieces per sequence (default 128)")
  p.add_argument("--batch-size", type=int, default=32,
                 help="sequences per device step up to 128 positions (default 32); a token "
                      "budget: proportionally fewer past 128 (one row of 8,192)")
  p.add_argument("--stats-impl", default="auto",
                 choices=("auto", "layerwise", "stacked", "kernel", "fused"),
                 help="how the statistics are computed (same scores to float32 rounding): auto "
                      "(default: the fastest measured path where the attention maps fit, the "
                      "map-free kernel past that), layerwise, stacked, kernel (map-free), fused")
  p.add_argument("--bucket-step", type=int, default=16,
                 help="pad lengths to multiples of this (default 16; 8 pads less but compiles more shapes)")
  p.add_argument("--tau", type=_tau, default=3.0, help="test threshold, a number or 'auto' (default 3)")
  p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
  p.add_argument("--test", choices=("t", "z"), default="t",
                 help="t: Student's t (default); z: the released notebooks' variant (ddof=0, t tail)")
  p.add_argument("--correction", choices=("none", "bonferroni", "holm", "bh"), default="none",
                 help="multiple-comparison correction over all tests of the run (default none, as the paper)")
  p.add_argument("--rule", choices=("calibrated", "paper", "average"), default="calibrated",
                 help="role rule: 'calibrated' (default, a heads_jax addition: a role also needs a score "
                      "significantly above what uniform attention scores, and near-uniform heads get "
                      "none), 'paper' (mean significantly above tau: the paper's test) or 'average' "
                      "(mean above tau, no test: the rule the paper's Fig. 2 argues against); "
                      "tests.csv holds the paper's and the calibrated decisions (DESIGN.md 3)")
  p.add_argument("--near-uniform-nats", type=float, default=0.1,
                 help="heads whose rows are on average within this KL divergence (nats) of uniform "
                      "attention are near-uniform (default 0.1)")
  p.add_argument("--direction", choices=("dep2head", "both"), default="dep2head",
                 help="syntactic sieves: dependent -> head (default) or both directions")
  p.add_argument("--no-syntax", dest="syntax", action="store_false",
                 help="skip the syntactic roles (no spaCy parse of text inputs)")
  p.add_argument("--parser", default=None, help="spaCy pipeline for text inputs (default en_core_web_sm); 'none' analyses text "
                      "inputs without arcs while CoNLL-U keeps its gold arcs")
  p.add_argument("--roles", default=None, help="comma-separated roles (default: all; an unknown name lists them)")
  p.add_argument("--no-measures", dest="measures", action="store_false",
                 help="skip the attention measures (entropy, attention to [CLS]/[SEP]/punctuation/neighbours)")
  p.add_argument("--js", action="store_true",
                 help="also the Jensen-Shannon distance between every pair of heads (about twice the time)")
  p.add_argument("--no-robustness", dest="robustness", action="store_false",
                 help="skip the second pass: roles under norm weights ||a f(x)||, attention sinks, "
                      "heads as dependency parsers (parser.csv; gold arcs only)")
  p.add_argument("--clusters", type=int, default=4, help="number of head clusters (default 4)")
  p.add_argument("--cluster-method", choices=("kmeans", "gmm"), default="kmeans")
  p.add_argument("--no-report", dest="report", action="store_false", help="skip figures and report.html")
  p.add_argument("--examples", type=int, default=3, metavar="N",
                 help="example sequences per head for the report's head view (examples.json; default 3, 0: none)")
  add_redo(p, names.ANALYZE, default_note="a rerun reuses scores.npz while the model, the data "
           "and the device pass's settings are the same, and recomputes only what a changed "
           "setting reaches")
  p.add_argument("--overwrite", action="store_true",
                 help="an alias of --redo scores: the device pass and every stage after it "
                      "run again, replacing what --out holds (another run's results or a "
                      "damaged file, which are refused without it)")
  g = p.add_argument_group("several host processes (a TPU pod slice, several GPU hosts)",
                           "each process runs its devices' rows of every batch; process 0 "
                           "writes --out. Unset values are auto-detected on Cloud TPU pods and "
                           "SLURM / Open MPI clusters")
  g.add_argument("--distributed", action="store_true",
                 help="join the other processes (jax.distributed) with auto-detected settings")
  g.add_argument("--coordinator-address", default="", metavar="HOST:PORT",
                 help="address of process 0's coordinator")
  g.add_argument("--num-processes", type=int, default=0, help="number of processes")
  g.add_argument("--process-id", type=int, default=-1, help="this process's id, 0 .. N-1")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def check(args):
  """The checks that need no JAX (`heads_jax.early`), before the CLI starts JAX: a bad model,
  data spec or --out is refused in a second or two."""
  from heads_jax import early
  early.check_model(args.model)
  early.check_data(args.data)
  early.check_out(args.out)


def main(args):
  from heads_jax.data.vocabulary import ROLES
  from heads_jax.errors import UserError
  from heads_jax.pipelines.analyze import AnalysisConfig, run_analysis
  roles = tuple(r.strip() for r in (args.roles or ",".join(ROLES)).split(",") if r.strip())
  unknown = [r for r in roles if r not in ROLES]
  if unknown:
    raise UserError(f"unknown roles {unknown}; choose from {', '.join(ROLES)}")
  cfg = AnalysisConfig(model=args.model, data=tuple(args.data), out=args.out,
                       max_examples=args.max_examples, max_length=args.max_length,
                       batch_size=args.batch_size, bucket_step=args.bucket_step, tau=args.tau, alpha=args.alpha, test=args.test,
                       correction=args.correction, rule=args.rule,
                       near_uniform_nats=args.near_uniform_nats, direction=args.direction, syntax=args.syntax,
                       parser=args.parser, roles=roles, measures=args.measures, js=args.js,
                       clusters=args.clusters,
                       cluster_method=args.cluster_method, report=args.report, examples=args.examples,
                       robustness=args.robustness, stats_impl=args.stats_impl)
  distributed = {"enabled": args.distributed, "coordinator_address": args.coordinator_address,
                 "num_processes": args.num_processes, "process_id": args.process_id}
  run_analysis(cfg, overwrite=args.overwrite, redo=args.redo, distributed=distributed)
