"""The device pass of an analysis: data specs -> encoded batches -> the jitted analysis step
-> ``scores.npz`` (sieve bias, distance features, lengths, each sequence's special-token share
and, for windowed models, its windowed baselines: `sequence_fields`; measures).

**Packed** (issue 38, the default wherever it is exact: ``step.packs``): the sequences are packed
several to a row (``pass_packing``: ``heads_jax.data.encoding.pack_batches``, first-fit
decreasing within the sort window): sequences of at most ``max_length / 2`` positions into short
rows of that length (``2 * batch_size`` of them a batch, at most ``PACK_SLOTS / 2`` sequences a
row), longer ones and the rows left at the end into rows of ``max_length`` (``batch_size / 4`` a
batch, at most ``PACK_SLOTS``); where more than a quarter of the first window's positions are in
longer sequences (sentence pairs), every row has ``max_length`` positions (``batch_size`` a
batch, the tail ``batch_size / 4``). Either way a pass compiles at most two shapes and pads a few
percent of its positions (UD EWT with MiniLM's tokenizer: BENCHMARKS.md, against 56.6%
unpacked, ``bench/bench_analysis.py``); short rows halve the query-key pairs per position, which
is what the per-layer statistics cost goes with on the CPU. Every score equals the unpacked
analysis's (``tests/stats/test_packing.py``). ``cfg.pack = False`` (or a step that cannot pack: a model
without ``segment_ids``, ``js``, the ``fused`` path) gives the unpacked pass:

Unpacked, it is compiled a bounded number of times (issue 35): every batch is padded to one of at
most three lengths (``heads_jax.stats.compiling.pass_lengths``: 32, 64, 128 for 128 positions;
the batch size is fixed). Either way the host encodes in a background thread, and the first batch
of each shape starts its compilation on the compile thread, for this pass and, behind it, for the
second pass (``pipelines/robustness.py``, unpacked, on the pass lengths) when the analysis runs
one.

Batches are sized by a token budget (``heads_jax.stats.compiling.batch_rows``): ``batch_size``
below means ``batch_size`` rows up to 128 positions and proportionally fewer past it (one row of
8,192), and under ``auto`` a shape whose per-layer maps would not fit takes the map-free
statistics kernel (``heads_jax.stats.step.auto_stats_impl``; packed too), so one long document
analyses with the default settings.

Owned by the accelerator work (how the pass compiles and batches); `heads_jax.pipelines.analyze`
calls it as its device stage.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np

from heads_jax import contract
from heads_jax.hoststats.calibration import sieve_uniform
from heads_jax.hoststats.clustering import special_share
from heads_jax.sieves import build_sieves
from heads_jax.data.specs import encode_spec, parse_spec
from heads_jax.data.vocabulary import SYNTACTIC_ROLES
from heads_jax.errors import UserError
from heads_jax.model.loading import load_model
from heads_jax.stats.collector import batch_slots, collect, combine_measures
from heads_jax.stats.norms import make_norm_step
from heads_jax.data.encoding import DEFAULT_SLOTS, pack_batches, row_slots
from heads_jax.stats.compiling import ahead, batch_rows, pass_batches, pass_lengths
from heads_jax.stats.step import make_analysis_step
from heads_jax.storage import local_copy


PACK_SLOTS = DEFAULT_SLOTS    # sequences per packed row of max_length at most


def pass_packing(batches, *, length: int, rows: int, window: int | None):
  """The pass's packed batches (module docstring; the benches pack with this too): short rows of
  ``length // 2`` where the data allow."""
  return pack_batches(batches, length=length, rows=rows, slots=PACK_SLOTS,
                      window=max(int(window or 0), rows), short_length=length // 2)


def host_inputs(step):
  """The batch builders' last stage (``compiling.ahead``'s ``prepare``, in their thread): each
  batch with what the host builds of it for ``step``'s program, the statistics kernel's tables
  where its path is the kernel's (``with_tables`` of ``stats.step.HostTables``: the analysis
  step and the second pass; slots as ``collect`` and ``run_norm_pass`` take them), so the
  device program only reads them."""
  def prepare(indices, batch):
    return step.with_tables(batch, batch_slots(batch, indices))
  return prepare


def packed_pass_batches(batches, step, *, length: int, rows: int, window: int | None, later=()):
  """The first pass's batches packed (``pass_packing``), produced ``ahead`` with their host
  inputs (``host_inputs``); the first batch of each shape starts its compilation
  (``step.precompile(b, k, slots=...)``) and, behind it, that of the second pass (``later``),
  which packs the same shapes (`pipelines.robustness`; a shape it runs map-free, unpacked, it
  compiles when it meets it)."""

  def on_shape(b, k):
    slots = row_slots(k, length, PACK_SLOTS)
    step.precompile(b, k, slots=slots)
    for other in later:
      other.precompile(b, k, priority=1, slots=slots)

  return ahead(pass_packing(batches, length=length, rows=rows, window=window), on_shape,
               prepare=host_inputs(step))


def check_vocabulary(model, tokenizer, where) -> None:
  """Refuses (UserError) a tokenizer whose ids reach past the model's embedding table (its
  pieces would read no embedding: NaN everywhere), before any device work."""
  size = getattr(model.config, "vocab_size", None)
  n = len(tokenizer) if tokenizer is not None else None
  if size is not None and n is not None and n > size:
    raise UserError(f"the tokenizer of {where} has {n} pieces but the model embeds only {size} "
                    f"(vocab_size): ids {size}..{n - 1} have no embedding; use the tokenizer the "
                    "model was trained with")


def second_pass_follows(cfg) -> bool:
  """Whether ``analyze`` runs the second pass after this one (``cfg.robustness``, one process)."""
  import jax
  return bool(getattr(cfg, "robustness", False)) and jax.process_count() == 1


def second_pass_step(cfg, model, roles, parsing: bool = True):
  """The second pass's step for ``cfg`` (an ``AnalysisConfig``): one definition, used by the
  second pass (``pipelines/robustness.py``) and by this pass, which starts its compilation early
  (so their programs are the same)."""
  return make_norm_step(model, roles=roles, direction=cfg.direction, parsing=parsing)


def sequence_fields(batch: dict, slots: int, *, roles, direction: str, windows=None) -> dict:
  """What the host statistics need of each sequence beyond the device's scores, from the
  encoded batch itself (host, numpy; `heads_jax.stats.collector.collect`'s ``fields``):
  ``special_share`` ``[b']`` (the share of its real keys that are [CLS], [SEP], comma or
  period: the clustering's reference, `heads_jax.hoststats.clustering.special_share`) and, for
  a model with windowed layers (``windows``: per layer the half window or None), ``uniform``
  ``[b', l, r]`` (uniform attention's sieve bias over the keys each layer sees, from the
  sequence's actual sieves: `heads_jax.hoststats.calibration.sieve_uniform`). ``b'`` = rows x
  ``max(slots, 1)``."""
  real = np.asarray(batch["attention_mask"]) > 0
  seg = (np.asarray(batch["segment_ids"]) if slots else real.astype(np.int32))
  parts = [special_share(batch["token_class"], real & (seg == j + 1))
           for j in range(max(int(slots), 1))]
  out = {"special_share": np.stack(parts, 1).reshape(-1)}
  if windows is not None and any(w is not None for w in windows):
    with jax.default_device(jax.devices("cpu")[0]):   # a few host masks, not the device's work
      sieves = np.asarray(build_sieves(batch, roles, direction))
    per = {w: sieve_uniform(sieves, seg, roles, w, slots) for w in set(windows)}
    out["uniform"] = np.stack([per[w] for w in windows], 1)
  return out


def compute_scores(cfg, model=None, tokenizer=None, progress: bool = True,
                   log=None) -> dict:
  """The device pass: ``{"sieve_bias", "distance", "lengths", "roles", "data_index", "data_info"}``.
  ``log``: where each data set's counts (read, empty dropped, truncated, duplicated) and
  warnings go (`heads_jax.data.specs.input_counts`)."""
  if model is None:
    model, tokenizer = load_model(local_copy(cfg.model))
  model.config.check_max_length(cfg.max_length)
  check_vocabulary(model, tokenizer, cfg.model)
  heads = model.config.num_layers * model.config.num_heads
  if cfg.clusters > heads:  # before the pass, not after it
    raise UserError(f"--clusters {cfg.clusters} is more than the model's {heads} heads; choose "
                    f"at most {heads}")
  roles = tuple(cfg.roles)
  if not cfg.syntax:
    roles = tuple(r for r in roles if r not in SYNTACTIC_ROLES)
  step = make_analysis_step(model, roles=roles, direction=cfg.direction, measures=cfg.measures,
                            js=cfg.js, stats_impl=getattr(cfg, "stats_impl", "auto"))
  # The second pass (pipelines/robustness.py) runs on the same shapes: its programs compile on
  # the background thread behind the first pass's (heads_jax.stats.compiling).
  later = [second_pass_step(cfg, model, roles)] if second_pass_follows(cfg) else []
  lengths = pass_lengths(cfg.max_length, cfg.bucket_step)
  rows = batch_rows(cfg.batch_size, cfg.max_length)   # a token budget: any length fits a batch
  windows = getattr(model.config, "windows", None)
  windows = tuple(windows) if windows is not None and any(w is not None for w in windows) else None
  fields = functools.partial(sequence_fields, roles=roles, direction=cfg.direction,
                             windows=windows)
  parts, infos = [], []
  for i, spec in enumerate(cfg.data):
    # parser "none": text inputs get no arcs (their syntactic scores are NaN); gold arcs stay.
    syntax = cfg.syntax and (cfg.parser != "none" or parse_spec(spec).kind == "conllu")
    info, batches, n = encode_spec(spec, tokenizer, max_length=cfg.max_length,
                                   batch_size=rows, max_examples=cfg.max_examples,
                                   parser=cfg.parser, syntax=syntax, pad_to_batch_size=True,
                                   sort_window=cfg.sort_window, bucket_step=cfg.bucket_step)
    if log is not None and info.counts is not None:
      log(f"{spec}: {info.counts.text(cfg.max_length)}")
      for w in info.warnings:
        log(f"warning: {w}")
    if n == 0:
      dropped = f" ({info.counts.empty} with no wordpiece dropped)" if info.counts and info.counts.empty else ""
      raise ValueError(f"data spec {spec!r} holds no examples{dropped}; check the file or the split")
    if getattr(cfg, "pack", True) and step.packs_for(rows, cfg.max_length):
      batches = packed_pass_batches(batches, step, length=cfg.max_length, rows=rows,
                                    window=cfg.sort_window, later=later)
    else:
      batches = pass_batches(batches, lengths, steps=[step], later=later,
                             prepare=host_inputs(step))
    result = collect(step, batches, n, roles=roles, progress=progress, desc=f"analyse {spec}",
                     fields=fields)
    result["data_index"] = np.full(n, i, np.int32)
    parts.append(result)
    infos.append(info.settings())
  keys = ("sieve_bias", "distance", "lengths", "data_index", "special_share") + (
      ("uniform",) if windows else ())
  out = {k: np.concatenate([p[k] for p in parts]) for k in keys}
  out["roles"] = roles
  out["stats_paths"] = sorted(step.paths_taken)
  if windows:
    out["windows"] = np.asarray([-1 if w is None else w for w in windows], np.int32)
  out["data_info"] = infos
  if cfg.measures:
    out["measures"] = combine_measures(parts)
  return out


def write_scores(out_dir, scores: dict) -> Path:
  """Writes ``scores.npz`` of the device pass; ``data_index`` only when there are several data sets."""
  several = len(set(scores["data_index"].tolist())) > 1
  return contract.write_scores(out_dir, scores["sieve_bias"], scores["roles"], scores["distance"],
                               scores["lengths"], scores["data_index"] if several else None,
                               special_share=scores.get("special_share"),
                               windows=scores.get("windows"), uniform=scores.get("uniform"))


