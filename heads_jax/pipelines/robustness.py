"""Are the roles real? The analysis's second pass: roles under norm weights, attention sinks and
no-op heads, heads as dependency parsers (issue 26; DESIGN.md section 4).

    second pass over the analysis's data (``heads_jax.stats.norms``, on device)
      -> norm_sieve_bias [N, l, h, r], first/sep attention, norm ratio, predicted words
      -> tests of the norm scores (the run's test and rule), roles that change, sink rate,
         parsing accuracy per relation and direction against fixed offsets (host)

``robustness_pass`` runs the device pass on the data of an ``AnalysisConfig`` (the same specs,
examples, length, roles and direction as the analysis, so the N axis is the analysis's);
``robustness_statistics`` turns its outputs and the analysis's tests into tables and
``summary.json`` keys. The parsing accuracies use the gold arcs only (``conllu`` data: UD EWT),
as Clark et al. evaluate heads against a treebank; text data parsed by spaCy still has its arcs
in the syntactic sieves of both weightings.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from heads_jax import contract
from heads_jax.data.encoding import iter_batches, row_slots
from heads_jax.data.specs import analysis_examples, input_counts, load_spec, parse_spec
from heads_jax.data import syntax as syn
from heads_jax.data.vocabulary import SYNTACTIC_ROLES
from heads_jax.hoststats.parsing import arcs_table, best_heads, parsing_table, role_agreement
from heads_jax.hoststats.sinks import (SINK_THRESHOLD, activation_summary, head_sinks,
                                      sink_summary)
from heads_jax.hoststats.summary import not_computed_reasons
from heads_jax.hoststats.weighting import (lost_roles, norm_tests, role_changes,
                                           weighting_summary, with_weighting)
from heads_jax.stats.compiling import ahead, batch_rows, pass_batches, pass_lengths
from heads_jax.stats.norms import run_norm_pass
from heads_jax.pipelines.device_pass import (PACK_SLOTS, host_inputs, pass_packing,
                                              second_pass_step)


@dataclasses.dataclass(frozen=True)
class RobustnessSettings:
  """Settings of the second pass and its statistics."""
  parsing: bool = True
  bootstrap: int = 1000             # resamples of the sentences for the parsing intervals
  min_arcs: int = 100               # relations scored beyond nsubj/obj/amod/advmod
  sink_threshold: float = SINK_THRESHOLD
  seed: int = 0


def _roles(cfg) -> tuple[str, ...]:
  roles = tuple(cfg.roles)
  return roles if cfg.syntax else tuple(r for r in roles if r not in SYNTACTIC_ROLES)


def norm_step(cfg, model, roles, settings: RobustnessSettings = RobustnessSettings()):
  """The second pass's step for ``cfg`` (an ``AnalysisConfig``) with ``settings``
  (`pipelines.device_pass.second_pass_step`, shared with the first pass)."""
  return second_pass_step(cfg, model, roles, parsing=settings.parsing)


def second_pass_packs(cfg, step, rows: int) -> bool:
  """Whether the second pass packs its batches of ``rows`` rows: where the analysis packs
  (``cfg.pack``) and the model takes packed rows (``NormStep.packs_for``), as the first pass
  decides (``pipelines.device_pass``)."""
  return bool(getattr(cfg, "pack", True)) and step.packs_for(rows, cfg.max_length)


def robustness_pass(cfg, model, tokenizer, settings: RobustnessSettings = RobustnessSettings(),
                    log=None) -> dict:
  """The device pass over ``cfg.data`` (an ``AnalysisConfig``): ``norm_sieve_bias``,
  ``first_attention``, ``sep_attention``, ``norm_ratio`` and ``parse_pred`` stacked over the
  specs (the analysis's N order), ``roles``, and ``arcs`` (the gold arcs, sequences numbered
  over N)."""
  log = log or (lambda *_: None)
  roles = _roles(cfg)
  step = norm_step(cfg, model, roles, settings)
  lengths = pass_lengths(cfg.max_length, cfg.bucket_step)  # the first pass's shapes
  # packed as the first pass packs, in the batches of its token budget
  rows = batch_rows(cfg.batch_size, cfg.max_length)   # the first pass's token budget
  packs = second_pass_packs(cfg, step, rows)
  parts, arcs, offset = [], [], 0
  for spec in cfg.data:
    syntax = cfg.syntax and (cfg.parser != "none" or parse_spec(spec).kind == "conllu")
    # the sequences of the first pass: examples with no wordpiece dropped (specs.input_counts)
    dataset, _ = input_counts(load_spec(spec, cfg.max_examples), tokenizer, cfg.max_length)
    nlp = syn.resolve_parser(cfg.parser) if syntax and not dataset.gold_arcs else None
    examples = list(analysis_examples(dataset, nlp, syntax))
    if not examples:
      raise ValueError(f"data spec {spec!r} holds no examples; check the file or the split")
    if dataset.gold_arcs and syntax:
      a = arcs_table(examples)
      a["sequence"] += offset
      arcs.append(a)
    batches = iter_batches(examples, tokenizer, max_length=cfg.max_length,
                           batch_size=rows, sort_window=cfg.sort_window,
                           bucket_step=cfg.bucket_step, pad_to_batch_size=True)
    if packs:   # the first pass's packed rows (pipelines.device_pass.pass_packing)
      batches = ahead(pass_packing(batches, length=cfg.max_length, rows=rows,
                                   window=cfg.sort_window),
                      lambda b, k: step.precompile(b, k, slots=row_slots(k, cfg.max_length,
                                                                         PACK_SLOTS)),
                      prepare=host_inputs(step))   # the map-free path's tables, on the host
    else:
      batches = pass_batches(batches, lengths, steps=[step], prepare=host_inputs(step))
    log(f"norm pass over {spec} ({len(examples)} sequences)")
    parts.append(run_norm_pass(step, batches, len(examples), cfg.max_length))
    offset += len(examples)
  out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  out["roles"] = roles
  out["arcs"] = (pd.concat(arcs, ignore_index=True) if arcs
                 else pd.DataFrame(columns=["sequence", "dependent", "head", "relation"]))
  return out


def robustness_statistics(result: dict, tests: pd.DataFrame, test_settings: dict, lengths,
                          settings: RobustnessSettings = RobustnessSettings()) -> dict:
  """Host statistics of a ``robustness_pass`` beside the analysis's ``tests`` (attention weights)
  and its settings (tau used, alpha, test, correction, rule).

  Returns ``norm_tests`` (the tests table of the norm scores, ``weighting`` = "norm"),
  ``role_changes``, ``sinks`` (per head), ``parser`` (``parser.csv``; None without parsing or
  gold arcs), ``best_parsers``, ``parser_agreement`` and ``summary`` (keys for ``summary.json``:
  ``by_weighting``, the sink keys of ``hoststats.sinks.sink_summary``, ``norm_lost_roles``).
  """
  nt = norm_tests(result["norm_sieve_bias"], result["roles"], test_settings, lengths)
  # a role whose sieve is empty on every sequence was not computed: null, never 0
  skip = not_computed_reasons(result["norm_sieve_bias"], result["roles"])
  changes = role_changes(tests, nt, skip)
  sinks = head_sinks(result["first_attention"], result["sep_attention"], result["norm_ratio"],
                     settings.sink_threshold)
  summary = {"by_weighting": weighting_summary(tests, nt, skip),
             **sink_summary(result["first_attention"], result["sep_attention"],
                            result["norm_ratio"], settings.sink_threshold)}
  summary["norm_lost_roles"] = lost_roles(changes)
  if result.get("hidden_norms") is not None:  # massive activations (Sun et al. 2024)
    summary.update(activation_summary(result["hidden_norms"]))
  out = {"norm_tests": nt, "role_changes": changes, "sinks": sinks, "parser": None,
         "best_parsers": None, "parser_agreement": None, "summary": summary}
  arcs = result.get("arcs")
  if settings.parsing and "parse_pred" in result and arcs is not None and len(arcs):
    table = parsing_table(result["parse_pred"], arcs, min_arcs=settings.min_arcs,
                          bootstrap=settings.bootstrap, seed=settings.seed)
    best = best_heads(table)
    out.update(parser=table, best_parsers=best, parser_agreement=role_agreement(table, tests))
    summary["parsing_relations_beating_baseline"] = int(best["beats_baseline"].sum())
    summary["parsing_relations"] = int(len(best))
  return out


def ensure_robustness_pass(cfg, out, model=None, tokenizer=None, *,
                           settings: RobustnessSettings = RobustnessSettings(), load=None,
                           log=print) -> bool:
  """Runs the second pass unless ``out`` already holds it for the same sequences (scores.npz's
  ``norm_sieve_bias`` and robustness.npz, matching ``lengths``): writes ``norm_sieve_bias`` into
  scores.npz and the rest into robustness.npz (``heads_jax.contract``). ``load``: a callable
  ``() -> (model, tokenizer)`` used when ``model`` is None. Returns whether it ran."""
  scores = contract.read_scores(out)
  kept = contract.read_robustness(out)
  if (scores.norm_sieve_bias is not None and kept is not None
      and kept["first_attention"].shape[0] == scores.num_sequences
      and (not settings.parsing or "parse_pred" in kept)):
    return False
  if model is None:
    model, tokenizer = load()
  log("second pass: norm-weighted roles, attention sinks, heads as parsers")
  result = robustness_pass(cfg, model, tokenizer, settings, log=lambda m: log("  " + m))
  if result["norm_sieve_bias"].shape != scores.sieve_bias.shape or tuple(result["roles"]) != scores.roles:
    raise ValueError(f"the second pass gave {result['norm_sieve_bias'].shape} for roles "
                     f"{result['roles']}, the analysis {scores.sieve_bias.shape} for {scores.roles}")
  contract.write_scores(out, scores.sieve_bias, scores.roles, scores.distance, scores.lengths,
                        scores.data_index, norm_sieve_bias=result["norm_sieve_bias"],
                        special_share=scores.special_share, windows=scores.windows,
                        uniform=scores.uniform)
  contract.write_robustness(out, result, result["arcs"] if settings.parsing else None)
  return True


def _share(x) -> str:
  """A share for the console: "n/a" for a role not computed (None), never 0%."""
  return "n/a" if x is None else f"{100 * x:.0f}%"


def robustness_host(out, host: dict, *, settings: RobustnessSettings = RobustnessSettings(),
                    log=print) -> dict | None:
  """The host statistics of the second pass beside the analysis's (``host`` of
  ``pipelines.analyze.host_statistics``): tests.csv gets the norm rows (``weighting``),
  summary.json the keys of ``robustness_statistics``, parser.csv the parsing table. Returns the
  statistics (None when ``out`` holds no second pass)."""
  scores = contract.read_scores(out)
  kept = contract.read_robustness(out)
  if scores.norm_sieve_bias is None or kept is None:
    return None
  result = dict(kept, norm_sieve_bias=scores.norm_sieve_bias, roles=scores.roles)
  st = robustness_statistics(result, host["tests"], host["settings"], scores.lengths, settings)
  contract.write_tests(with_weighting(host["tests"], st["norm_tests"]), host["settings"], out)
  summary = dict(host["summary"], **st["summary"])
  contract.write_summary(summary, out)
  host["summary"] = summary
  if st["parser"] is not None:
    contract.write_parser(st["parser"], out)
  by = st["summary"]["by_weighting"]
  log("norm weights: " + ", ".join(f"{r} {_share(by['attention'][r])} -> {_share(by['norm'][r])}"
                                   for r in by["attention"])
      + f"; sink rate {100 * st['summary']['sink_rate']:.0f}%, mean norm ratio "
        f"{st['summary']['mean_norm_ratio']:.2f}")
  if st["best_parsers"] is not None:
    beat = st["summary"]["parsing_relations_beating_baseline"]
    log(f"heads as parsers: the best head beats the best fixed offset on {beat} of "
        f"{st['summary']['parsing_relations']} relation-directions (parser.csv)")
  return st
