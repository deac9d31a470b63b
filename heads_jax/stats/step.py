"""The analysis step: model forward + sieves + statistics in one jitted, data-parallel call.

    step = make_analysis_step(model, roles=ROLES, direction="dep2head")
    out = step(batch)            # host numpy encoded batch [b, k] -> numpy results
    out["sieve_bias"]            # float32 [b, l, h, r]  (NaN where a role's sieve is empty)
    out["distance"]              # float32 [b, l, h, 21]

With ``measures=True`` the same pass also returns the measures of ``heads_jax.stats.measures``
(Clark et al. 2019): ``entropy`` and ``cls_entropy`` ``[b, l, h]``, ``token_attention``
``[b, l, h, 5]``; with ``js=True`` also ``js`` ``[b, l*h, l*h]`` (Jensen-Shannon distances
between heads, costly: ``(l h)^2 q k`` logarithms per sequence).

Inside the single ``jax.jit`` function each layer's attention is reduced on the device to the
per-sequence statistics right after its softmax and never reaches the host. ``stats_impl``
chooses how (all give the same numbers to float32 rounding, ``tests/stats/test_fused.py``):

* ``"layerwise"`` (default on CPU and TPU): the model's ``attention_reduce`` hook runs
  ``heads_jax.stats.layerwise`` on each layer's probabilities ``[b, h, q, k]``: one matmul
  against per-batch weights and one entropy pass per layer, no ``[b, l, h, q, k]`` stack and
  no normalised or entropy-weighted copies.
* ``"fused"`` (never a default: it measured slowest on a GPU): the model keeps its fused attention (cuDNN for bfloat16) and
  the hook runs the Pallas kernel of ``heads_jax.stats.fused`` on each layer's queries and keys;
  the probabilities are never written to memory. Off a GPU the kernel runs in Pallas interpret
  mode (correct, slow: for tests). A ``"uniform"`` head gate needs the probabilities and
  falls back to ``"layerwise"``.
* ``"kernel"`` (statistics kernel v2, issue 38; never a default until a device has measured it):
  the model keeps its fast attention and ``heads_jax.stats.kernel`` reduces the layers' queries
  and keys (on a GPU or TPU in one call after the forward, where they fit
  ``kernel.STASH_BYTES``; else one a layer): one tile function (``heads_jax.stats.tile``) wrapped for Triton on GPUs, for
  Mosaic on TPUs, and as a ``lax.map`` over query blocks on CPUs (and for sequences longer than
  a Pallas wrapper takes, ``kernel.wrapper_for``), so no map is ever written and memory is
  linear in the sequence length. Its per-batch tables (sieve sizes, weights, window thresholds:
  ``kernel.kernel_tables``) are built on the host with the batch (``AnalysisStep.with_tables``:
  the device pass's batch builders, else ``submit``) and come to the program as the batch field
  ``kernel.TABLES``, sharded like the batch. A ``"uniform"`` head gate falls back to
  ``"layerwise"``.
* ``"stacked"`` (default on GPUs where the stack fits): the model returns ``attentions``
  ``[b, l, h, q, k]`` and the stand-alone functions reduce the stack (the original path; any
  callable with the model API).

``"auto"`` takes, per platform, the path measured fastest there (``AUTO_STATS_IMPL``; DESIGN.md
section 2 "The analysis step's paths" gives the figures): on a GPU ``"stacked"`` (H200, BERT-base,
batch 128 x 128, bfloat16: 1.60x the bare forward, against 1.88x for ``"layerwise"`` and 3.47x
for ``"fused"``, ``../shared/measurements/gpu-2026-11-26/analysis_step.log``) for every batch
whose stack fits the device's memory (``stack_fits``), else ``"layerwise"``; ``"layerwise"`` on
CPUs and TPUs (the kernel does not lower for TPUs: ``tests/e2e/test_lowering.py``); and on every
platform the map-free ``"kernel"`` for a batch whose per-layer maps would not fit
(``layer_maps_fit``: ``LAYER_MAP_BYTES`` per device and layer), where the model allows it
(``can_go_map_free``), so any length runs (issue 50 item 5). ``"fused"``
is never a default: only ``stats_impl="fused"`` or ``HEADS_JAX_STATS_IMPL=fused`` take it (a
compile error then reaches the caller). ``HEADS_JAX_STATS_IMPL`` forces a path where
``stats_impl`` is ``"auto"`` (``heads_jax.env``), the stacked one whatever its memory. A model
whose ``__call__`` has no ``attention_reduce`` parameter, and ``js=True`` (which compares all
heads with each other), always take ``"stacked"``.

**Packed batches** (issue 38): a batch with a ``segment_ids`` field ``[B, K]`` holds several
sequences per row (1, 2, ... per sequence, 0 on padding; ``heads_jax.data.encoding.pack_batches``).
The model attends within each sequence and restarts its positions there (``segment_ids``,
``position_ids`` of the model's ``__call__``), and ``layerwise``/``stacked``/``kernel`` reduce per sequence:
every output has ``B * S`` rows, row ``i * S + j`` the sequence in slot j of row i (S =
``slots``, static per program), equal to the sequence's unpacked statistics.
``step.packs`` says whether the step can take them (the model has ``segment_ids``, the path is
``layerwise``, ``stacked`` or ``kernel``, no ``js``).

Each batch shape is compiled once per process (``heads_jax.stats.compiling.executable``);
``step.precompile(rows, length)`` starts a shape's compilation on a background thread, so that
it overlaps the host's encoding (``compiling.ahead``; the device pass does this).
The jitted program is built once per model graph (configuration), statistics options, mesh and
platform and shared by every ``AnalysisStep`` made with them (``analysis_program``), so a run
that makes several steps (reproduce: one per model and data set) compiles each batch shape once
per process, not once per step. ``compute_dtype="bfloat16"`` runs the encoder's matmuls in
bfloat16 (float32 softmax and statistics; the error against float32 is in BENCHMARKS.md). The batch is padded with all-padding rows to a multiple of the
number of (local) devices of the ``data`` mesh and sharded over it; the model state is
replicated on the mesh once, when the step is made. Only the real rows come back. With several
host processes every process passes the same global batch and gets all its rows back.

This is where the model and the sieves meet (DESIGN.md section 2): neither imports the other.
"""

from __future__ import annotations

import abc
import functools
import inspect
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from heads_jax import env
from heads_jax.data.vocabulary import BATCH_FIELDS, ROLES
from heads_jax.parallel import (batch_sharding, data_mesh, pad_to_multiple, replicate, replicated,
                                shard_batch, shard_global_batch)
from heads_jax.sieves import check_direction, check_roles, segment_positions
from heads_jax.stats import compiling, kernel
from heads_jax.stats.fused import fused_reducer, fused_tables, target_platform
from heads_jax.stats.layerwise import batch_tables, finish, layer_reducer, reduce_stack

GATE_MODES = ("remove", "uniform")
STATS_IMPLS = ("auto", "layerwise", "fused", "stacked", "kernel")
COMPUTE_DTYPES = ("float32", "bfloat16")
PACKED_STATS_IMPLS = ("layerwise", "stacked", "kernel")   # the paths that reduce packed rows per sequence


# What "auto" takes per platform: the path measured fastest there, among those that lower there
# (tests/e2e/test_lowering.py). GPU: H200, BERT-base, batch 128 x 128, bfloat16, step time over the
# bare forward: stacked 1.60, layerwise 1.88, fused 3.47 (DESIGN.md section 2).
AUTO_STATS_IMPL = {"gpu": "stacked", "tpu": "layerwise", "cpu": "layerwise"}
# The stacked path holds the float32 stack [b, l, h, q, k] and about two temporaries of its size
# (the weighted copies of its reductions); it is taken while that fits in this share of a
# device's memory, and "layerwise" (no stack) is taken beyond.
STACK_COPIES = 3
STACK_MEMORY_SHARE = 0.5
# The per-layer path holds one layer's float32 maps [b, h, q, k] and several temporaries of their
# size (scores, probabilities, the weighted products: one 8,192-position sequence of a 2-layer,
# 8-head BERT, 2.1 GB of maps, peaked at 21.7 GB on the CPU). Past this many bytes of maps per
# device and layer "auto" takes the map-free statistics kernel ("kernel": memory linear in the
# length), on every platform.
LAYER_MAP_BYTES = 256 * 2 ** 20


def default_stats_impl(platform: str | None = None) -> str:
  """The ``"auto"`` choice: ``HEADS_JAX_STATS_IMPL`` when set, else ``AUTO_STATS_IMPL`` of
  ``platform`` (default: JAX's default backend; ``"cuda"``/``"rocm"`` count as ``"gpu"``)."""
  forced = env.get("HEADS_JAX_STATS_IMPL").strip().lower()
  if forced:
    if forced not in STATS_IMPLS or forced == "auto":
      raise ValueError(f"HEADS_JAX_STATS_IMPL must be one of {STATS_IMPLS[1:]}, got {forced!r}")
    return forced
  return AUTO_STATS_IMPL.get(target_platform(platform), "layerwise")


def stack_bytes(batch: int, layers: int, heads: int, length: int) -> int:
  """Bytes of the stacked path's float32 attention stack ``[b, l, h, q, k]`` (q = k = length)
  of ``batch`` sequences on one device: 0.3 GB for BERT-base at 32 x 128, 4.8 GB at 32 x 512."""
  return 4 * int(batch) * int(layers) * int(heads) * int(length) ** 2


def stack_fits(batch: int, layers: int, heads: int, length: int,
               memory_bytes: int | None) -> bool:
  """Whether the stacked path's stack and its temporaries (``STACK_COPIES`` stacks) fit in
  ``STACK_MEMORY_SHARE`` of ``memory_bytes`` (a device's memory; None: unknown, taken to fit)."""
  if memory_bytes is None:
    return True
  return STACK_COPIES * stack_bytes(batch, layers, heads, length) <= STACK_MEMORY_SHARE * memory_bytes


def layer_maps_fit(batch: int, heads: int, length: int) -> bool:
  """Whether one layer's float32 maps ``[b, h, q, k]`` of ``batch`` sequences (per device) of
  ``length`` positions stay within ``LAYER_MAP_BYTES`` (what the per-layer path holds)."""
  return stack_bytes(batch, 1, heads, length) <= LAYER_MAP_BYTES


def auto_stats_impl(platform: str | None, *, batch: int, layers: int, heads: int, length: int,
                    memory_bytes: int | None, map_free: bool = True) -> str:
  """``"auto"``'s path for a batch of ``batch`` sequences (per device) of ``length`` positions of
  an encoder with ``layers`` x ``heads``: ``HEADS_JAX_STATS_IMPL`` when set, else the platform's
  ``AUTO_STATS_IMPL``, with ``"stacked"`` replaced by ``"layerwise"`` where its stack does not
  fit ``memory_bytes`` (``stack_fits``), and ``"layerwise"`` by the map-free ``"kernel"`` where
  one layer's maps do not fit (``layer_maps_fit``; ``map_free``: whether the model allows it)."""
  impl = default_stats_impl(platform)
  if env.get("HEADS_JAX_STATS_IMPL").strip():
    return impl
  if impl == "stacked" and not stack_fits(batch, layers, heads, length, memory_bytes):
    impl = "layerwise"
  if impl == "layerwise" and map_free and not layer_maps_fit(batch, heads, length):
    impl = "kernel"
  return impl


def can_go_map_free(model) -> bool:
  """Whether the statistics kernel can serve ``model``: its heads' logits are ``q . k`` over all
  real keys (not DeBERTa's disentangled logits, not a sliding window)."""
  windows = getattr(getattr(model, "config", None), "windows", None) or ()
  return (getattr(model, "logits_from_query_key", True) and accepts_attention_reduce(model)
          and all(w is None for w in windows))


def device_memory_bytes(mesh) -> int | None:
  """The memory of this process's first device of ``mesh`` (``memory_stats()["bytes_limit"]``),
  None where JAX does not say (CPUs)."""
  local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  try:
    stats = local[0].memory_stats() if local else None
  except Exception:  # noqa: BLE001  (backends without memory statistics)
    stats = None
  limit = (stats or {}).get("bytes_limit")
  return int(limit) if limit else None


def accepts_term_shares(model) -> bool:
  """Whether ``model(...)`` can return ``term_shares`` (DeBERTa: each head's share of its logits'
  variance from the c2c, c2p and p2c terms, ``heads_jax.model.deberta``)."""
  fn = type(model).__call__ if isinstance(model, nnx.Module) else model
  try:
    return "return_term_shares" in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def with_term_shares(result: dict, out: dict) -> dict:
  """``result`` plus the model's ``term_shares`` float32 ``[b, l, h, 3]`` when it returned them."""
  if "term_shares" in out:
    result["term_shares"] = out["term_shares"]
  return result


def accepts_attention_reduce(model) -> bool:
  """Whether ``model(...)`` takes the per-layer ``attention_reduce`` hook (heads_jax encoders)."""
  fn = type(model).__call__ if isinstance(model, nnx.Module) else model
  try:
    return "attention_reduce" in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def with_compute_dtype(model, dtype: str):
  """The same encoder (same parameter arrays) computing in ``dtype`` (``"float32"`` or
  ``"bfloat16"``; parameters, softmax and LayerNorm stay float32). Needs a module built as
  ``type(model)(config, rngs=...)`` with a ``config.dtype`` field."""
  if dtype not in COMPUTE_DTYPES:
    raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {dtype!r}")
  config = getattr(model, "config", None)
  if config is None or not hasattr(config, "replace"):
    raise TypeError(f"compute_dtype needs a heads_jax encoder with a config; got "
                    f"{type(model).__name__}")
  if config.dtype == dtype:
    return model
  cfg = config.replace(dtype=dtype)
  abstract = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  _, state = nnx.split(model)
  return nnx.merge(graphdef, state)


def accepts_packing(model) -> bool:
  """Whether ``model(...)`` takes packed rows (``segment_ids`` and ``position_ids``)."""
  fn = type(model).__call__ if isinstance(model, nnx.Module) else model
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False
  return "segment_ids" in params and "position_ids" in params


def _check_batch(batch: dict) -> dict:
  """The batch's int32 fields (BATCH_FIELDS, and ``segment_ids`` of a packed batch)."""
  missing = [f for f in BATCH_FIELDS if f not in batch]
  if missing:
    raise KeyError(f"batch lacks field(s) {missing}; an analysis batch needs all of "
                   f"{list(BATCH_FIELDS)} (see heads_jax/data/vocabulary.py)")
  fields = BATCH_FIELDS + (("segment_ids",) if batch.get("segment_ids") is not None else ())
  arrays = {f: np.asarray(batch[f]) for f in fields}
  shape = arrays["input_ids"].shape
  if len(shape) != 2 or shape[0] == 0:
    raise ValueError(f"batch fields must be [b, k] with b >= 1; input_ids has shape {shape}")
  bad = {f: a.shape for f, a in arrays.items() if a.shape != shape}
  if bad:
    raise ValueError(f"every batch field must have the shape of input_ids {shape}; got {bad}")
  for f, a in arrays.items():
    if not np.issubdtype(a.dtype, np.integer):
      raise TypeError(f"batch field {f!r} must be integer, got {a.dtype}")
  return {f: a.astype(np.int32) for f, a in arrays.items()}


def _host_rows(x: jax.Array, rows: int) -> np.ndarray:
  """The first ``rows`` rows of this process's part of a batch-sharded array, as numpy."""
  if x.is_fully_addressable:
    return np.asarray(x)[:rows]
  shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
  seen, parts = set(), []
  for s in shards:
    start = s.index[0].start or 0
    if start not in seen:
      seen.add(start)
      parts.append(np.asarray(s.data))
  return np.concatenate(parts)[:rows]


@functools.lru_cache(maxsize=128)
def analysis_program(graph, *, roles: tuple, direction: str, gate_mode: str, measures: bool,
                     js: bool, stats_impl: str, mesh, fused_block_q: int | None = None,
                     platform: str = "cpu", multi_process: bool = False, slots: int = 0):
  """The jitted analysis program ``run(state, batch, head_gate) -> dict`` (one per distinct
  argument set, cached: ``jax.jit`` then compiles each batch shape once per process).

  Args:
    graph: the encoder's ``nnx.GraphDef`` (``state`` is its ``nnx.State``), or a callable with
      the model API (``state`` is None).
    roles, direction, gate_mode, measures, js: as ``make_analysis_step`` (already checked).
    stats_impl: ``"layerwise"``, ``"fused"``, ``"stacked"`` or ``"kernel"`` (resolved: not
      ``"auto"``).
    mesh: the ``data`` mesh (a ``Mesh``, or an ``AbstractMesh`` to lower with ``jax.export``).
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``: what the program is compiled for (the fused
      kernel lowers with Triton for ``"gpu"``, in interpret mode otherwise).
    multi_process: outputs replicated (every process gets all rows) instead of batch-sharded.
    slots: 0 for unpacked batches; S for packed ones (``segment_ids``; ``layerwise`` and
      ``stacked`` only): every output then has ``b * S`` rows (module docstring).
  """
  with_measures, with_js = bool(measures or js), bool(js)

  def analyse(module, batch, head_gate):
    kwargs = {}
    if head_gate is not None:
      kwargs = {"head_gate": head_gate, "gate_mode": gate_mode}
    inputs = (batch["input_ids"],)
    common = dict(attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                  deterministic=True, **kwargs)
    if slots:
      common.update(segment_ids=batch["segment_ids"],
                    position_ids=segment_positions(batch["segment_ids"]))
    # DeBERTa (heads_jax.model.deberta): its heads' logits are not query . key, so the kernels
    # that recompute them cannot serve it; it also returns each head's term shares.
    if with_measures and accepts_term_shares(module):
      common["return_term_shares"] = True
    impl = path_served(stats_impl, module, head_gate is not None and gate_mode == "uniform")
    if impl == "layerwise":
      tables = batch_tables(batch, roles, direction, with_measures, slots)
      reduce = layer_reducer(tables, roles, batch["attention_mask"], with_measures)
      out = module(*inputs, attention_reduce=reduce, **common)
      return with_term_shares(finish(out["attention_reduced"], tables), out)
    if impl == "kernel":
      rows, length = batch["input_ids"].shape
      wrapper = kernel.wrapper_for(platform, length)
      tables = kernel.given_tables(batch, roles, direction, with_measures, wrapper, slots)
      settings = kernel.KernelSettings(wrapper=wrapper, platform=platform)
      if _stash_fits(module, wrapper, rows // (mesh.size if mesh is not None else 1), length):
        # one Pallas call for every layer, after the forward (issue 50 item 3)
        out = module(*inputs, attention_reduce=kernel.stash_reducer(), **common)
        stash = out["attention_reduced"]
        return finish(kernel.kernel_stacked_stats(stash["query"], stash["key"], tables, roles,
                                                  direction, with_measures, settings, mesh=mesh),
                      tables)
      reduce = kernel.kernel_reducer(tables, roles, direction, with_measures, settings, mesh=mesh)
      out = module(*inputs, attention_reduce=reduce, **common)
      return finish(out["attention_reduced"], tables)
    if impl == "fused":
      tables = fused_tables(batch, roles, direction, with_measures, platform=platform)
      reduce = fused_reducer(tables, roles, direction, with_measures, block_q=fused_block_q,
                             mesh=mesh, platform=platform)
      out = module(*inputs, attention_reduce=reduce, **common)
      return finish(out["attention_reduced"], tables)
    out = module(*inputs, return_attentions=True, **common)
    # one weight table, one matmul, one entropy pass over the stack [b, l, h, q, k]
    return with_term_shares(reduce_stack(out["attentions"], batch, roles, direction,
                                         with_measures, js=with_js, slots=slots), out)

  out_shardings = replicated(mesh) if multi_process else batch_sharding(mesh)
  if isinstance(graph, nnx.GraphDef):
    def analysis_pass(state, batch, head_gate):
      return analyse(nnx.merge(graph, state), batch, head_gate)
  else:
    def analysis_pass(state, batch, head_gate):
      del state
      return analyse(graph, batch, head_gate)
  return jax.jit(analysis_pass, out_shardings=out_shardings)  # name: compiling.PROGRAM_NAMES


def path_served(stats_impl: str, module, uniform_gate: bool) -> str:
  """The path a program of ``stats_impl`` runs for ``module``: the kernels (``"fused"``,
  ``"kernel"``) recompute each head's logits as ``q . k`` and never see the probabilities, so a
  model whose logits are not that (DeBERTa) and a ``"uniform"`` head gate (``uniform_gate``: it
  edits the probabilities) take ``"layerwise"``."""
  if stats_impl in ("fused", "kernel") and (
      uniform_gate or not getattr(module, "logits_from_query_key", True)):
    return "layerwise"
  return stats_impl


def _stash_fits(module, wrapper: str, rows: int, length: int) -> bool:
  """Whether the kernel path runs one call for all layers (``kernel.stash_fits``) for an encoder
  with a config (layers, width, compute dtype); else one a layer."""
  config = getattr(module, "config", None)
  try:
    layers, width = int(config.num_layers), int(config.hidden_size)
    itemsize = jnp.dtype(config.dtype).itemsize
  except (AttributeError, TypeError):
    return False
  return kernel.stash_fits(wrapper, rows, layers, length, width, itemsize)


class PendingResult:
  """Results of a dispatched step, still on the device; ``result()`` fetches them."""

  def __init__(self, outputs: dict, rows: int):
    self._outputs, self.rows = outputs, rows

  def result(self) -> dict:
    return {name: _host_rows(x, self.rows) for name, x in self._outputs.items()}


class HostTables(abc.ABC):
  """What a step (``AnalysisStep``, ``norms.NormStep``) builds on the host for its program beside
  the batch: the statistics kernel's tables (``kernel.host_tables``) where a batch's path is the
  kernel's (``_kernel_measures``: whether with the measures' weights, None where it takes none).
  Needs ``mesh``, ``multiple``, ``roles``, ``direction``, ``platform``."""

  @abc.abstractmethod
  def _kernel_measures(self, rows: int, length: int, head_gate=None) -> bool | None:
    """Whether a padded batch ``[rows, length]``'s kernel tables carry the measures' weights;
    None where its path takes no tables (each step says: ``AnalysisStep``, ``NormStep``)."""

  def _table_specs(self, rows: int, length: int, slots: int = 0,
                   head_gate=None) -> dict | None:
    """The shapes of the kernel's tables a padded batch ``[rows, length]`` goes with to its
    program (``kernel.table_specs``), None where its path takes none."""
    measures = self._kernel_measures(rows, length, head_gate)
    if measures is None:
      return None
    return kernel.table_specs(rows, length, self.roles, self.direction, measures,
                              wrapper=kernel.wrapper_for(self.platform, length), slots=slots)

  def input_specs(self, rows: int, length: int, slots: int = 0) -> dict:
    """The program's batch argument for a padded batch ``[rows, length]`` as
    ``jax.ShapeDtypeStruct`` sharded over the mesh (to lower it): the int32 fields, and on the
    kernel path its tables (``kernel.TABLES``)."""
    sharding = batch_sharding(self.mesh)
    spec = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=sharding)
    specs = {f: spec for f in BATCH_FIELDS + (("segment_ids",) if slots else ())}
    tables = self._table_specs(rows, length, slots)
    if tables is not None:
      specs[kernel.TABLES] = {n: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
                              for n, x in tables.items()}
    return specs

  def _tables_for(self, padded: dict, slots: int, head_gate=None, given=None) -> dict | None:
    """The kernel's tables of a padded host batch where its path takes them (``given`` where
    they have the shapes it needs, else ``kernel.host_tables``), else None."""
    b, k = padded["input_ids"].shape
    want = self._table_specs(b, k, slots, head_gate)
    if want is None:
      return None
    if given is not None and {n: np.shape(x) for n, x in given.items()} == {
        n: x.shape for n, x in want.items()}:
      return given
    return kernel.host_tables(padded, self.roles, self.direction,
                              self._kernel_measures(b, k, head_gate),
                              wrapper=kernel.wrapper_for(self.platform, k), slots=slots)

  def with_tables(self, batch: dict, slots: int = 0) -> dict:
    """``batch`` with, where its path is the kernel's, the kernel's tables of the batch padded
    to the devices (``kernel.TABLES``: ``kernel.host_tables``, numpy, built on the host's CPU);
    else ``batch`` itself. The device pass calls it where it builds the batches (in their
    thread); a call of the step builds them where a batch comes without them (or with other
    shapes)."""
    rows, length = np.shape(batch["input_ids"])
    if self._kernel_measures(-(-rows // self.multiple) * self.multiple, length) is None:
      return batch  # a path without tables: nothing to check, pad or build here
    padded, _ = pad_to_multiple(_check_batch(batch), self.multiple)
    tables = self._tables_for(padded, int(slots), given=batch.get(kernel.TABLES))
    return batch if tables is None else {**batch, kernel.TABLES: tables}


class AnalysisStep(HostTables):
  """Callable analysis step; see ``make_analysis_step``."""

  def __init__(self, model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
               mesh=None, gate_mode: str = "remove", measures: bool = False, js: bool = False,
               stats_impl: str = "auto", compute_dtype: str | None = None,
               fused_block_q: int | None = None, platform: str | None = None,
               memory_bytes: int | None = None):
    self.roles = check_roles(roles)
    self.direction = check_direction(direction)
    if gate_mode not in GATE_MODES:
      raise ValueError(f"gate_mode must be one of {GATE_MODES}, got {gate_mode!r}")
    self.gate_mode = gate_mode
    self.measures, self.js = bool(measures or js), bool(js)
    self.mesh = data_mesh() if mesh is None else mesh
    # One process: batches are padded to a multiple of its devices. Several processes (a pod,
    # or `heads-jax analyze --num-processes`): every process passes the same global batch, each
    # supplies its devices' rows, and the results come back replicated to all of them.
    self.multi_process = jax.process_count() > 1
    local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
    self.multiple = self.mesh.devices.size if self.multi_process else max(1, len(local))
    # A task model (pre-training / classification) carries its encoder as `.bert`; only the
    # encoder's attentions are needed, so skip the task heads (MLM logits are costly).
    encoder = getattr(model, "bert", model)
    if compute_dtype is not None:
      encoder = with_compute_dtype(encoder, compute_dtype)
    self.model = encoder
    if stats_impl not in STATS_IMPLS:
      raise ValueError(f"stats_impl must be one of {STATS_IMPLS}, got {stats_impl!r}")
    self.platform = target_platform(platform)
    auto = stats_impl == "auto"
    if auto:
      stats_impl = default_stats_impl(self.platform)
    if self.js or not accepts_attention_reduce(encoder):
      stats_impl, auto = "stacked", False
    self.stats_impl = stats_impl  # the path of a batch whose stack fits (path_for)
    config = getattr(encoder, "config", None)
    self._shape = (getattr(config, "num_layers", None), getattr(config, "num_heads", None))
    self._map_free = can_go_map_free(encoder)
    self._adaptive = (auto and stats_impl in ("stacked", "layerwise")
                      and None not in self._shape)
    self.memory_bytes = device_memory_bytes(self.mesh) if memory_bytes is None else memory_bytes
    self.fused_block_q = fused_block_q
    if isinstance(encoder, nnx.Module):
      self._graph, state = nnx.split(encoder)
      self._state = replicate(state, self.mesh)
    else:
      if not callable(encoder):
        raise TypeError(f"model must be an nnx.Module or a callable, got {type(encoder).__name__}")
      self._graph, self._state = encoder, None
    self._state_signature = compiling.signature(self._state)
    self._model_packs = accepts_packing(encoder)
    self.paths_taken: set = set()   # the statistics paths of the batches submitted (run.json)

  @property
  def packs(self) -> bool:
    """Whether this step takes packed batches (``segment_ids``) of some shape: the model
    restarts positions and attends within a segment, and the paths this step takes where the
    maps fit reduce per sequence (``PACKED_STATS_IMPLS``; the Jensen-Shannon distances compare
    whole rows, so not with js). ``packs_for`` says it of one shape."""
    paths = {self.stats_impl, "layerwise"} if self._adaptive else {self.stats_impl}
    return self._model_packs and not self.js and paths <= set(PACKED_STATS_IMPLS)

  def packs_for(self, rows: int, length: int) -> bool:
    """Whether a batch ``[rows, length]`` may be packed: ``packs``, and its path
    (``path_for``) reduces per sequence."""
    return self.packs and self.path_for(rows, length) in PACKED_STATS_IMPLS

  def path_for(self, rows: int, length: int) -> str:
    """The statistics path of a batch ``[rows, length]`` (rows padded to the devices): the
    step's ``stats_impl``, or under ``auto`` ``"layerwise"`` where the stack does not fit and
    ``"kernel"`` where one layer's maps do not (``auto_stats_impl``)."""
    if not self._adaptive:
      return self.stats_impl
    per_device = -(-int(rows) // self.mesh.devices.size)
    return auto_stats_impl(self.platform, batch=per_device, layers=self._shape[0],
                           heads=self._shape[1], length=length, memory_bytes=self.memory_bytes,
                           map_free=self._map_free)

  def program(self, stats_impl: str, slots: int = 0):
    """The jitted program of ``stats_impl`` for this step's options (``analysis_program``;
    ``slots``: packed batches' sequences per row, 0 unpacked)."""
    if slots and not (self.packs and stats_impl in PACKED_STATS_IMPLS):
      raise ValueError(f"this analysis step cannot take packed batches (model accepts segment_ids: "
                       f"{self._model_packs}, path {self.stats_impl!r}, js {self.js}); pass "
                       f"unpacked batches (no segment_ids)")
    return analysis_program(
        self._graph, roles=self.roles, direction=self.direction, gate_mode=self.gate_mode,
        measures=self.measures, js=self.js, stats_impl=stats_impl, mesh=self.mesh,
        fused_block_q=self.fused_block_q, platform=self.platform,
        multi_process=self.multi_process, slots=int(slots))

  def _kernel_measures(self, rows: int, length: int, head_gate=None) -> bool | None:
    """``self.measures`` where the batch's path (``path_for``, ``path_served``) is the kernel's,
    else None (``HostTables``)."""
    uniform = head_gate is not None and self.gate_mode == "uniform"
    if path_served(self.path_for(rows, length), self.model, uniform) != "kernel":
      return None
    return self.measures

  def _executable(self, rows: int, length: int, background: bool = False, priority: int = 0,
                  slots: int = 0):
    """The Future of the compiled program of a padded batch ``[rows, length]`` (no head gate;
    ``slots`` > 0: a packed batch with that many sequences per row)."""
    program = self.program(self.path_for(rows, length), slots)
    key = (rows, length, self._state_signature) + ((slots,) if slots else ())
    return compiling.executable(
        program, key,
        lambda: program.lower(self._state, self.input_specs(rows, length, slots), None),
        background=background, priority=priority)

  def precompile(self, rows: int, length: int, priority: int = 0, slots: int = 0) -> None:
    """Starts compiling the program of a batch of ``rows`` sequences (packed rows with ``slots``)
    of ``length`` positions on the background compile thread (nothing with several processes:
    they compile at the call)."""
    if not self.multi_process:
      self._executable(-(-int(rows) // self.multiple) * self.multiple, int(length),
                       background=True, priority=priority, slots=int(slots))

  def submit(self, batch: dict, head_gate=None, slots: int | None = None) -> PendingResult:
    """Pads, shards and dispatches ``batch`` without waiting for the result.

    Args:
      batch: host encoded batch (``heads_jax.data.vocabulary``), every field ``[b, k]``; a
        packed batch also has ``segment_ids`` and gives ``b * slots`` result rows. On the
        kernel path, its tables (``with_tables``) when the batch builder made them; else they
        are built here, on the host.
      head_gate: optional float ``[l, h]`` passed to the model with this step's gate_mode.
      slots: a packed batch's sequences per row (default: its largest segment id).
    """
    fields = _check_batch(batch)
    if "segment_ids" in fields:
      slots = int(fields["segment_ids"].max(initial=1)) if slots is None else int(slots)
    else:
      slots = 0
    padded, rows = pad_to_multiple(fields, self.multiple)
    tables = self._tables_for(padded, slots, head_gate, batch.get(kernel.TABLES))
    if tables is not None:
      padded = {**padded, kernel.TABLES: tables}
    device_batch = (shard_global_batch if self.multi_process else shard_batch)(padded, self.mesh)
    b, k = padded["input_ids"].shape
    self.paths_taken.add(self.path_for(b, k))
    if head_gate is not None or self.multi_process:
      if head_gate is not None:
        head_gate = replicate(jnp.asarray(head_gate, jnp.float32), self.mesh)
      out = self.program(self.path_for(b, k), slots)(self._state, device_batch, head_gate)
    else:
      out = self._executable(b, k, slots=slots).result()(self._state, device_batch, None)
    return PendingResult(out, rows * max(slots, 1))

  def __call__(self, batch: dict, head_gate=None, slots: int | None = None) -> dict:
    """``{"sieve_bias": float32 [b, l, h, r], "distance": float32 [b, l, h, 21]}`` (numpy),
    plus the measures when the step was made with ``measures`` / ``js`` (``b * slots`` rows for
    a packed batch)."""
    return self.submit(batch, head_gate, slots).result()


def make_analysis_step(model, roles: Sequence[str] = ROLES, direction: str = "dep2head",
                       mesh=None, gate_mode: str = "remove", measures: bool = False,
                       js: bool = False, stats_impl: str = "auto",
                       compute_dtype: str | None = None,
                       fused_block_q: int | None = None,
                       platform: str | None = None,
                       memory_bytes: int | None = None) -> AnalysisStep:
  """The jitted analysis step of ``model``.

  Args:
    model: an ``nnx.Module`` (``BertModel``, or a task model whose ``.bert`` is used), or any
      callable with the model API: ``model(input_ids, attention_mask=, token_type_ids=,
      return_attentions=True, deterministic=True[, head_gate=, gate_mode=])`` returning a dict
      with ``attentions`` ``[b, l, h, q, k]``. A module's state is replicated on the mesh once.
    roles: role names (subset of ``ROLES``), the r axis of ``sieve_bias``.
    direction: ``"dep2head"`` or ``"both"`` for the relation sieves.
    mesh: the one-axis ``data`` mesh (default: all devices).
    gate_mode: how a ``head_gate`` given to the step is applied (model API).
    measures: also return ``entropy``, ``cls_entropy`` ``[b, l, h]`` and ``token_attention``
      ``[b, l, h, 5]`` (``heads_jax.stats.measures``; cheap).
    js: also return the Jensen-Shannon distances ``js`` ``[b, l*h, l*h]`` between heads
      (implies ``measures``; costs ``(l h)^2 q k`` logarithms per sequence; takes the
      ``"stacked"`` path).
    stats_impl: ``"auto"``, ``"layerwise"``, ``"fused"``, ``"stacked"`` or ``"kernel"`` (module
      docstring).
    compute_dtype: ``None`` (the model's own), ``"float32"`` or ``"bfloat16"``: the encoder's
      matmul dtype for this step (``with_compute_dtype``).
    fused_block_q: queries per Pallas program for ``"fused"`` (default: the kernel's choice).
    platform: the platform the step compiles for (default: JAX's default backend); only the
      tests of ``auto`` set it.
    memory_bytes: the device memory ``auto`` plans the stacked path's stack with (default: the
      device's, ``device_memory_bytes``; unknown on CPUs).

  Returns:
    an ``AnalysisStep``: ``step(batch, head_gate=None) -> dict`` of numpy arrays for the real
    rows, and ``step.submit(batch)`` to dispatch without waiting (``.result()`` fetches).
  """
  return AnalysisStep(model, roles=roles, direction=direction, mesh=mesh, gate_mode=gate_mode,
                      measures=measures, js=js, stats_impl=stats_impl,
                      compute_dtype=compute_dtype, fused_block_q=fused_block_q,
                      platform=platform, memory_bytes=memory_bytes)
