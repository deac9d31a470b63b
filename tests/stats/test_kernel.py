"""Statistics kernel v2 (heads_jax.stats.tile, heads_jax.stats.kernel) on the CPU: the window
decomposition exact, the tile against the stand-alone ("stacked") statistics in float32 and
bfloat16, singles and pairs, padding, arcs both ways, the 32/64/128 buckets at their lower edge
(the most window corrections), the NaN pattern; both Pallas wrappers in interpret mode (the TPU
one also under ``pltpu.InterpretParams``); the tile's operation count; and memory linear in the
sequence length (no ``h * q * k`` buffer at 8,192 positions)."""

import collections

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests import reference_impl as ref
from heads_jax.data import vocabulary as B
from heads_jax.doctor import relative_error
from heads_jax.sieves import build_sieves, distance_bins, NUM_WINDOWS
from heads_jax.stats import kernel, layerwise, tile
from heads_jax.stats.distance import distance_features
from heads_jax.stats.measures import all_measures
from heads_jax.stats.sieve_bias import sieve_bias

OUTPUTS = ("sieve_bias", "distance", "entropy", "cls_entropy", "token_attention")


# -- the window decomposition ---------------------------------------------------------------------

@pytest.mark.slow
def test_window_decomposition_is_exact():
  """onehot(window(t, s)) = E0[s] + sum_j [|s - t| >= theta_j(s)] D_j[s] for every row of the
  first, a middle and the last block and every key, and so A @ onehot equals the decomposed
  contraction on any A (to float64 rounding)."""
  rng = np.random.default_rng(0)
  for rows, n in [(8, 17), (16, 37), (16, 128), (28, 100)]:
    keys = -(-n // rows) * rows
    for t0 in sorted({0, (keys // rows // 2) * rows, keys - rows}):
      e0, terms = tile.window_masks(t0, n, rows, keys)
      assert len(terms) == int(tile.corrections(n, rows))
      got = np.broadcast_to(np.asarray(e0)[None], (rows, keys, NUM_WINDOWS)).astype(np.float64)
      for mask, d in terms:
        got = got + np.asarray(mask)[..., None] * np.asarray(d)[None]
      t = t0 + np.arange(rows)[:, None]
      dist = np.abs(np.arange(keys)[None, :] - t)
      want = np.minimum(15, (16 * dist) // n)
      np.testing.assert_array_equal(got, np.eye(NUM_WINDOWS)[want])
      a = rng.random((rows, keys))
      direct = np.einsum("tk,tkw->tw", a, np.eye(NUM_WINDOWS)[want])
      decomposed = a @ np.asarray(e0, np.float64) + sum(
          (a * np.asarray(m)) @ np.asarray(d, np.float64) for m, d in terms)
      assert np.max(np.abs(decomposed - direct)) < 1e-13


def test_windows_match_the_sieves_bins():
  """window_of is the window of heads_jax.sieves.distance_bins (float arithmetic, integer result)."""
  for n in (1, 7, 17, 100, 8192):
    d = np.arange(1, min(n, 300) + 1)
    np.testing.assert_array_equal(np.asarray(tile.window_of(d, n)), np.minimum(15, 16 * d // n))
  mask = np.ones((1, 40), np.int32)
  bins = np.asarray(distance_bins(np.zeros((1, 40), np.int32), mask))[0]
  d = np.abs(np.arange(40)[None] - np.arange(40)[:, None])
  np.testing.assert_array_equal(np.where(d > 0, bins, 0), np.where(d > 0, tile.window_of(d, 40), 0))


# -- the tile against the stand-alone statistics --------------------------------------------------

def _case(seed, b, k, h, e, min_len, dtype):
  """A reference batch (singles and pairs, padding, arcs) with random queries and keys in
  ``dtype`` and the float64 probabilities of their masked softmax ``[b, h, q, k]``."""
  rng = np.random.default_rng(seed)
  batch = ref.random_batch(rng, b, k, min_len=min_len)
  q = jnp.asarray(2.0 * rng.normal(size=(b, k, h, e)), dtype)
  kk = jnp.asarray(2.0 * rng.normal(size=(b, k, h, e)), dtype)
  mask = batch["attention_mask"] > 0
  s = np.einsum("bqhe,bkhe->bhqk", np.asarray(q, np.float64), np.asarray(kk, np.float64)) / np.sqrt(e)
  s = np.where(mask[:, None, None, :], s, -np.inf)
  m = np.max(s, axis=-1, keepdims=True)
  ex = np.where(mask[:, None, None, :], np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
  p = ex / np.maximum(ex.sum(-1, keepdims=True), 1e-300)
  return batch, q, kk, p * mask[:, None, :, None]


def _stacked(batch, p, direction):
  """The stand-alone functions (the definitions, what ``stacked`` computes) on ``p`` as one layer
  (one compiled program)."""
  def run(batch, attn):
    mask, tc = batch["attention_mask"], batch["token_class"]
    out = {"sieve_bias": sieve_bias(attn, build_sieves(batch, B.ROLES, direction), mask,
                                    B.ROLES),
           "distance": distance_features(attn, tc, mask)}
    out.update(all_measures(attn, tc, mask))
    return out
  out = jax.jit(run)({f: np.asarray(x) for f, x in batch.items()},
                     jnp.asarray(p[:, None], jnp.float32))                  # [b, 1, h, q, k]
  return {key: np.asarray(v)[:, 0] for key, v in out.items()}


def _kernel(batch, q, kk, direction, wrapper="xla", slots=0, **kw):
  """Kernel v2 on one layer's ``q, kk``, as the step runs it (tables, statistics, ``finish``),
  in one compiled program (``slots``: a packed batch's sequences a row)."""
  def run(batch, q, kk):
    tables = kernel.kernel_program_tables(batch, B.ROLES, direction, True, wrapper=wrapper,
                                          slots=slots)
    out = kernel.kernel_layer_stats(q, kk, tables, B.ROLES, direction, True, wrapper=wrapper,
                                    **kw)
    return layerwise.finish({key: v[:, None] for key, v in out.items()}, tables)
  out = jax.jit(run)({f: np.asarray(x) for f, x in batch.items()}, q, kk)
  return {key: np.asarray(v)[:, 0] for key, v in out.items()}


def _check(got, want, tol):
  for key in OUTPUTS:
    assert np.array_equal(np.isnan(got[key]), np.isnan(want[key])), key
    assert relative_error(got[key], want[key]) <= tol, (key, relative_error(got[key], want[key]))


@pytest.mark.slow
@pytest.mark.parametrize("k, min_len, dtype, direction", [
    (32, 17, jnp.float32, "dep2head"),        # 32 bucket at its lower edge
    (64, 33, jnp.bfloat16, "dep2head"),       # 64 bucket, bf16 inputs
    (128, 65, jnp.bfloat16, "both"),          # 128 bucket (J(n) up to 4 corrections), both ways
    (24, 1, jnp.float32, "both"),             # any length down to 1, J(n) past the unrolled 4
])
def test_tile_equals_stacked(k, min_len, dtype, direction):
  seed = k + min_len
  while True:   # the first seed whose batch has a pair, a single text, padding and arcs
    batch, q, kk, p = _case(seed, b=5, k=k, h=2, e=16, min_len=min_len, dtype=dtype)
    types = batch["token_type_ids"].max(axis=1)
    if (types.max() == 1 and types.min() == 0 and (batch["attention_mask"] == 0).any()
        and (batch["dep_head"] >= 0).any()):
      break
    seed += 100
  filler = min_len == 1          # an all-padding row (a batch padded to the devices)
  if filler:
    batch["attention_mask"][-1] = 0
    p[-1] = 0.0
  # the reference from the same (rounded) inputs: bf16 inputs, float32 products as the kernel's
  got = _kernel(batch, q, kk, direction)
  _check(got, _stacked(batch, p, direction), 1e-5)
  if filler:   # NaN sieve bias and zeros elsewhere, as the other paths
    assert np.isnan(got["sieve_bias"][-1]).all()
    for key in OUTPUTS[1:]:
      assert np.all(got[key][-1] == 0), key


# -- the Pallas wrappers in interpret mode --------------------------------------------------------

@pytest.fixture(scope="module")
def small_case():
  batch, q, kk, p = _case(11, b=3, k=20, h=2, e=16, min_len=10, dtype=jnp.bfloat16)
  return batch, q, kk, _stacked(batch, p, "both")


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["triton", "mosaic"])
def test_pallas_wrappers_in_interpret_mode(small_case, wrapper):
  """Both Pallas wrappers as the step runs them on a device: every layer in one call
  (``kernel_stacked_stats``: two layers' queries and keys ``[b, l, k, h, e]``, the second the
  first's heads reversed, folded into the grid, each reading its sequence's tables), equal the
  stand-alone statistics layer by layer."""
  batch, q, kk, want = small_case
  qs, ks = jnp.stack([q, q[:, :, ::-1]], axis=1), jnp.stack([kk, kk[:, :, ::-1]], axis=1)

  def run(batch, qs, ks):
    tables = kernel.kernel_program_tables(batch, B.ROLES, "both", True, wrapper=wrapper)
    out = kernel.kernel_stacked_stats(qs, ks, tables, B.ROLES, "both", True, wrapper=wrapper,
                                      interpret=True)
    return layerwise.finish(out, tables)
  got = jax.jit(run)({f: np.asarray(x) for f, x in batch.items()}, qs, ks)
  for layer, heads in ((0, slice(None)), (1, slice(None, None, -1))):
    _check({key: np.asarray(v)[:, layer] for key, v in got.items()},
           {key: v[:, heads] for key, v in want.items()}, 1e-5)


@pytest.mark.slow
def test_triton_settings_in_interpret_mode(small_case):
  """The Triton program's settings the bench times, as one ``kernel.KernelSettings``: no window
  correction shared by the heads (``static=0``: each built per head) and all heads in one
  program (the last measured tile, each head's epilogue after the block's shared setup): the
  same numbers."""
  batch, q, kk, want = small_case
  settings = kernel.KernelSettings(wrapper="triton", interpret=True, static=0,
                                   heads_per_program="all")
  _check(_kernel(batch, q, kk, "both", wrapper="triton", settings=settings), want, 1e-5)
  with pytest.raises(TypeError, match="unknown kernel setting"):
    kernel.KernelSettings.of(settings, sums="reduce")


def _short_case(k: int):
  """bf16 ``_case`` with 3 rows: one long, one of at most 16 real positions (its later key blocks
  all padding), one all padding (a batch padded to the devices), a pair and arcs."""
  seed = k
  while True:
    batch, q, kk, p = _case(seed, b=3, k=k, h=2, e=16, min_len=1, dtype=jnp.bfloat16)
    n = batch["attention_mask"].sum(1)
    if (n[0] > k // 2 and n[1] <= 16 and (batch["dep_head"][:2] >= 0).any()
        and batch["token_type_ids"][:2].max() == 1):
      break
    seed += 1
  batch["attention_mask"][-1] = 0
  p[-1] = 0.0
  return batch, q, kk, p


@pytest.mark.slow
def test_key_blocks_add_up_to_the_whole_tile():
  """tile.head_rows_blocked (two passes over key blocks of 32: row max and Z, then every sum
  block by block) equals tile.head_rows on all 128 keys at once, for query blocks at the start,
  middle and end of a sequence and one of a sequence of at most 16 positions (its later key
  blocks all padding, window corrections past the unrolled ones), arcs both ways (the
  dependency sums' one code path of the blocks; ``test_tile_equals_stacked`` has dep2head)."""
  batch, q, kk, _ = _short_case(128)
  roles = tile.tile_roles(B.ROLES)
  rows, bk = 16, 32
  rows_i, starts = np.array([0, 0, 0, 1]), np.array([0, 48, 112, 0])
  q, kk = np.asarray(q), np.asarray(kk)          # host slices: no compilation per case
  for direction in ("both",):
    tables = jax.jit(kernel.kernel_tables, static_argnums=(1, 2, 3))(batch, B.ROLES, direction,
                                                                      True)
    tables = {name: np.asarray(v) for name, v in tables.items()}

    def inputs(kr_, kc_, qi_):
      return (tuple(kr_[j:j + 1, :] for j in range(tile.K_ROWS)),
              tuple(kc_[:, j:j + 1] for j in range(tile.K_ROWS)),
              tuple(qi_[:, j:j + 1] for j in range(tile.Q_COLS)))

    def whole(t0, qb, keys, et, n, *tabs):
      kr, kc, qi = inputs(*tabs)
      setup = tile.block_setup(kr, kc, et, n, t0, rows)
      return tile.head_rows(qb, keys, setup, qi, kr, roles=roles, direction=direction,
                            scale=0.25)

    def blocked(t0, qb, keys, et, n, *tabs):
      kr, kc, qi = inputs(*tabs)

      def load(b):
        cut = lambda x, axis: jax.lax.dynamic_slice_in_dim(x, b * bk, bk, axis)  # noqa: E731
        return (cut(keys, 0), tuple(cut(x, 1) for x in kr), tuple(cut(x, 0) for x in kc),
                cut(et, 0))

      return tile.head_rows_blocked(qb, load, 128 // bk, bk, qi, n, t0, roles=roles,
                                    direction=direction, scale=0.25)

    qi_blocks = np.stack([tables["q_info"][r, t:t + rows] for r, t in zip(rows_i, starts)])
    blocked, whole = jax.jit(blocked), jax.jit(whole)
    for i, (r, t) in enumerate(zip(rows_i, starts)):
      args = (jnp.int32(t), q[r, t:t + rows, 0], kk[r, :, 0], tables["e_table"][r],
              qi_blocks[i][:, tile.Q_N:tile.Q_N + 1], tables["k_rows"][r], tables["k_cols"][r],
              qi_blocks[i])
      # float32 rounding: the entropy as -sum p x (p = exp(s - lse)) against ln Z - sum ex x / Z
      np.testing.assert_allclose(np.asarray(blocked(*args)), np.asarray(whole(*args)),
                                 rtol=1e-5, atol=1e-5, err_msg=f"row {r}, queries from {t}")


@pytest.mark.slow
def test_triton_key_loop_in_interpret_mode():
  """The Triton program's key loop (past ``kernel.ONE_PASS_KEYS``; forced here: 32 keys in
  blocks of 16), two heads a program, against the stand-alone statistics, NaN pattern equal."""
  batch, q, kk, p = _short_case(32)
  got = _kernel(batch, q, kk, "both", wrapper="triton", interpret=True, block_k=16,
                heads_per_program="all")
  _check(got, _stacked(batch, p, "both"), 1e-5)
  assert np.isnan(got["sieve_bias"][-1]).all()


@pytest.mark.slow
def test_mosaic_wrapper_under_tpu_interpret_params(small_case):
  """pltpu.InterpretParams simulates the TPU's blocks and memory (out-of-bounds reads raise,
  uninitialised memory is NaN), so the Mosaic wrapper's indexing is checked too; here with the
  float32 contraction (one float32 dot instead of the bf16 halves): the same numbers."""
  from jax.experimental.pallas import tpu as pltpu
  batch, q, kk, want = small_case
  _check(_kernel(batch, q, kk, "both", wrapper="mosaic", interpret=pltpu.InterpretParams(),
                 contraction="float32"), want, 1e-5)


# -- the operation count --------------------------------------------------------------------------

_FREE = {"broadcast_in_dim", "dot_general", "iota", "pjit", "jit", "reshape", "cond", "while"}


def _tile_ops(jaxpr, rows, keys, counts):
  """Equations with a ``[rows, keys]`` output or reducing one (MMAs, broadcasts, iotas free),
  in ``counts["tile"]``, each cond branch's in ``counts["branch"]`` (the taken branch of each
  correction) and each loop body's in ``counts["loop"]``."""
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "cond":
      branch = collections.Counter()
      for br in eqn.params["branches"]:
        c = {"tile": collections.Counter(), "branch": [], "loop": collections.Counter()}
        _tile_ops(br.jaxpr, rows, keys, c)
        if sum(c["tile"].values()) > sum(branch.values()):
          branch = c["tile"]
      counts["branch"].append(branch)
      continue
    if name == "while":
      c = {"tile": collections.Counter(), "branch": [], "loop": collections.Counter()}
      _tile_ops(eqn.params["body_jaxpr"].jaxpr, rows, keys, c)
      counts["loop"].update(c["tile"])
      continue
    for v in eqn.params.values():
      if isinstance(v, jax.extend.core.ClosedJaxpr):
        _tile_ops(v.jaxpr, rows, keys, counts)
    if name in _FREE:
      continue
    tile_out = any(getattr(o.aval, "shape", None) == (rows, keys) for o in eqn.outvars)
    tile_in = any(getattr(getattr(i, "aval", None), "shape", None) == (rows, keys)
                  for i in eqn.invars)
    if tile_out or (tile_in and name.startswith("reduce")):
      counts["tile"][name] += 1


def test_operation_count_per_tile_element():
  """About 20 ALU operations per attention element (the first kernel: 83 tile equations and 26
  row reductions): BERT-base's head size, bf16, all 13 roles and the measures, a 128-position
  sequence (n = 128: J = 2 window corrections at T = 16)."""
  rows, keys, e = 16, 128, 64
  S = jax.ShapeDtypeStruct
  args = (S((rows, e), jnp.bfloat16), S((keys, e), jnp.bfloat16),
          tuple(S((rows, 1), jnp.int32) for _ in range(tile.Q_COLS)),
          tuple(S((1, keys), jnp.int32) for _ in range(tile.K_ROWS)),
          tuple(S((keys, 1), jnp.int32) for _ in range(tile.K_ROWS)),
          S((keys, tile.E_COLS), jnp.float32), S((), jnp.int32), S((), jnp.int32))
  fn = lambda *a: tile.tile_values(*a, roles=tile.tile_roles(B.ROLES), direction="dep2head",  # noqa: E731
                                   measures=True, scale=e ** -0.5)
  counts = {"tile": collections.Counter(), "branch": [], "loop": collections.Counter()}
  _tile_ops(jax.make_jaxpr(fn)(*args).jaxpr, rows, keys, counts)
  j = int(tile.corrections(128, rows))
  assert j == 2 and len(counts["branch"]) == tile.STATIC_CORRECTIONS
  per_correction = sum(counts["branch"][0].values())
  total = sum(counts["tile"].values()) + j * per_correction
  assert per_correction <= 3, counts["branch"][0]          # one compare, two selects (hi, lo)
  assert sum(counts["loop"].values()) <= 3, counts["loop"]
  assert total <= 25, (total, counts)


# -- any length ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_memory_is_linear_in_the_sequence_length():
  """The statistics of one 8,192-position sequence (8 heads) compile with no buffer of
  ``h * q * k`` elements: the largest temporaries are ``[h, T, k]`` tiles."""
  b, k, h, e = 1, 8192, 8, 16
  S = jax.ShapeDtypeStruct
  batch = {f: S((b, k), jnp.int32) for f in B.BATCH_FIELDS}

  def stats(q, kk, bt):
    tables = kernel.kernel_program_tables(bt, B.ROLES, "dep2head", True, wrapper="xla")
    return kernel.kernel_layer_stats(q, kk, tables, B.ROLES, "dep2head", True, wrapper="xla")

  qk = S((b, k, h, e), jnp.float32)
  compiled = jax.jit(stats).lower(qk, qk, batch).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  map_bytes = 4 * h * k * k                                                # 2.1 GB
  assert temp < map_bytes / 16, (temp, map_bytes)


@pytest.mark.parametrize("direction", ["dep2head", "both"])
def test_sieve_sizes_without_the_sieves(direction):
  """kernel.sieve_sizes (linear in the length) is |S(t)| of heads_jax.sieves.build_sieves."""
  for seed in range(2):
    batch = ref.random_batch(np.random.default_rng(seed), 8, 24, min_len=1)
    want = np.asarray(build_sieves(batch, B.ROLES, direction)).sum(-1)
    np.testing.assert_array_equal(np.asarray(kernel.sieve_sizes(batch, B.ROLES, direction)), want)


@pytest.mark.slow   # the host's table program compiles (~5 s on a loaded 2-core machine)
def test_the_tables_the_host_sends_are_the_kernels_tables():
  """``kernel.host_tables`` (built by the host's CPU, in the form sent to the device:
  ``sent_tables``, about half the bytes) made whole by ``device_tables`` are exactly
  ``kernel_program_tables`` of the batch: padded keys (Triton), a packed row's slots, both
  directions' sieve sizes, the measures' weights."""
  batch = ref.random_batch(np.random.default_rng(3), 3, 20, min_len=2)
  batch["segment_ids"] = (batch["attention_mask"] > 0).astype(np.int32)     # one slot a row
  args = (B.ROLES, "both", True)
  sent = kernel.host_tables(batch, *args, wrapper="triton", slots=1)
  assert all(isinstance(x, np.ndarray) for x in sent.values()) and "k_cols" not in sent
  got = kernel.device_tables(sent, *args)
  want = kernel.kernel_program_tables(batch, *args, wrapper="triton", slots=1)
  assert set(got) == set(want) and got["q_info"].shape[1] == 32
  for name, x in want.items():
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(x), err_msg=name)


@pytest.mark.slow
def test_an_8192_position_sequence_analyses_with_no_map_sized_buffer():
  """Issue 38 item 3 through the analysis step: a tiny BERT with 8,192 positions, one sequence,
  stats_impl="kernel": the compiled program (forward with the model's query-chunked attention,
  statistics by query blocks) holds no buffer near ``h * q * k`` elements."""
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh
  from heads_jax.stats.step import make_analysis_step
  k = 8192
  cfg = config_for("tiny", vocab_size=128, max_position_embeddings=k)
  step = make_analysis_step(BertModel(cfg, rngs=nnx.Rngs(0)), measures=True,
                            stats_impl="kernel", mesh=data_mesh(jax.devices()[:1]))
  compiled = step.program("kernel").lower(step._state, step.input_specs(1, k), None).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  map_bytes = 4 * cfg.num_heads * k * k                                    # 1.07 GB
  assert temp < map_bytes / 4, (temp, map_bytes)   # 154 MB: the forward's query chunks


@pytest.mark.slow
def test_analysis_step_kernel_equals_stacked_on_8_devices():
  """stats_impl="kernel" through the analysis step on a tiny BERT (attention sharpened), batch
  split over the 8 emulated devices, its tables built on the host (``with_tables``, as the
  device pass's batch builders do, or in ``submit``); the program refuses a batch without them;
  a "uniform" head gate falls back to layerwise."""
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.stats.step import make_analysis_step
  assert len(jax.devices()) == 8
  model = BertModel(config_for("tiny", vocab_size=2048, max_position_embeddings=32),
                    rngs=nnx.Rngs(1))
  for layer in model.layers:
    layer.attention.query.kernel[...] = layer.attention.query.kernel[...] * 40
  batch = ref.random_batch(np.random.default_rng(5), 6, 16, min_len=2)
  want = make_analysis_step(model, measures=True, stats_impl="stacked")(batch)
  step = make_analysis_step(model, measures=True, stats_impl="kernel")
  assert step.stats_impl == "kernel"
  built = step.with_tables(batch)
  tables = built[kernel.TABLES]
  assert all(isinstance(x, np.ndarray) and len(x) == 8 for x in tables.values())  # padded rows
  _check(step(built), want, 1e-5)
  _check(step(batch), want, 1e-5)
  with pytest.raises(ValueError, match="kernel_tables"):
    step.program("kernel")(step._state, {f: np.asarray(batch[f]) for f in B.BATCH_FIELDS}, None)
  gate = np.ones((2, 4), np.float32)
  gate[1, 2] = 0.0
  gated = make_analysis_step(model, measures=True, stats_impl="stacked", gate_mode="uniform")
  kernel_gated = make_analysis_step(model, measures=True, stats_impl="kernel", gate_mode="uniform")
  _check(kernel_gated(batch, head_gate=gate), gated(batch, head_gate=gate), 1e-5)


# -- packed rows (issue 50 item 4) -----------------------------------------------------------------

def _placed(x, indices, packed, slots):
  """``[B, K, ...]``: each packed sequence's rows of ``x`` ``[b, k, ...]`` at its offset."""
  seg = packed["segment_ids"]
  out = np.zeros(seg.shape + x.shape[2:], np.float32)
  for row in range(seg.shape[0]):
    for j in range(slots):
      i = indices[row * slots + j]
      at = np.flatnonzero(seg[row] == j + 1)
      if i >= 0 and len(at):
        out[row, at[0]:at[0] + len(at)] = np.asarray(x[i], np.float32)[:len(at)]
  return out


@pytest.mark.slow
def test_packed_rows_equal_unpacked():
  """Several sequences a row (``segment_ids``) through the kernel's Triton program in interpret
  mode: each sequence's scores equal its unpacked run's (its own keys only, its own
  length's windows across a block shared with another sequence, its own [CLS], sieves and
  weights), per slot; pairs, single texts, arcs both ways."""
  from heads_jax.data import encoding
  batch, q, kk, _ = _case(21, b=7, k=14, h=2, e=16, min_len=1, dtype=jnp.float32)
  want = _kernel(batch, q, kk, "both")
  slots = 4
  packed_batches = list(encoding.pack_batches([(np.arange(7), batch)], length=32, rows=3,
                                              slots=slots, window=8, tail_rows=3))
  assert len(packed_batches) == 1 and packed_batches[0][1]["segment_ids"].max() > 1
  [(indices, packed)] = packed_batches
  pq = jnp.asarray(_placed(np.asarray(q), indices, packed, slots))
  pk = jnp.asarray(_placed(np.asarray(kk), indices, packed, slots))
  keep = indices >= 0
  # the tile in the Triton program (interpreted); the XLA wrapper: tests/stats/test_packing.py
  got = _kernel(packed, pq, pk, "both", wrapper="triton", slots=slots, interpret=True)
  for key in OUTPUTS:
    assert got[key].shape[0] == len(indices)
    np.testing.assert_array_equal(np.isnan(got[key][keep]), np.isnan(want[key][indices[keep]]))
    assert relative_error(got[key][keep], want[key][indices[keep]]) <= 1e-5, key
