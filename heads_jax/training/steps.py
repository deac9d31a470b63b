"""Pure, jitted train and eval steps, data-parallel over the ``data`` mesh.

The model is split once (``nnx.split``) into its graph definition, its parameters (a pure
nested dict of float32 arrays, the master weights) and its random-number state. A train state
is the pytree ``{"step": int32 [], "params": ..., "opt_state": ...}``; it is replicated over
the mesh, batches are split over it along b, and ``jax.jit`` inserts the gradient all-reduce
(the form in which JAX now implements ``pmap``). The state is donated to each step.

Dropout keys of step ``N`` are ``fold_in(key(dropout_seed), N)`` (one further ``fold_in`` per
dropout layer), so a step's randomness depends only on the seed and the step number: a run
resumed from step ``N`` draws the same masks as one that never stopped. ``dropout_rng`` names
the key's implementation (``DROPOUT_RNGS``): ``"threefry2x32"`` (JAX's default), or ``"rbg"``
(pre-training's default), whose bits come from XLA's ``RngBitGenerator`` (Philox on GPU and
CPU, the hardware generator on TPU) at a fraction of threefry's integer work (about 25-30
int32 operations per 32-bit word, over 1.2 G words per BERT-base step), while its keys are
still derived (``fold_in``) by threefry: the bits stay a function of (seed, step), so resume
stays exact. ``"unsafe_rbg"`` also derives its keys with ``RngBitGenerator`` (MaxText's
choice). The bits an ``rbg`` key draws depend on the backend and on how the array is
partitioned: a resumed run on the same devices draws the same ones.

Losses (batch field names as ``heads_jax.data.pretraining``):

* pre-training: masked-LM cross-entropy averaged over the real predictions
  (``sum(w * nll) / (sum(w) + 1e-5)`` as BERT's ``run_pretraining.py``) plus the
  next-sentence cross-entropy averaged over the batch;
* classification: cross-entropy averaged over rows with ``weights`` 1 (padding rows of an
  eval batch have weight 0).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from heads_jax.errors import UserError
from heads_jax.parallel import DATA_AXIS


@dataclasses.dataclass
class ModelParts:
  """What ``merge`` needs besides the parameters: graph definition and rng state."""
  graphdef: object
  rng_state: object
  rest: object


def split_model(model: nnx.Module) -> tuple[ModelParts, dict]:
  """``(parts, params)``: params as a pure nested dict of arrays."""
  graphdef, params, rng_state, rest = nnx.split(model, nnx.Param, nnx.RngState, ...)
  return ModelParts(graphdef, rng_state, rest), nnx.to_pure_dict(params)


def merge_model(parts: ModelParts, params, dropout_key=None) -> nnx.Module:
  """A model with ``params``; with ``dropout_key`` every rng stream is reseeded from it."""
  rng_state = parts.rng_state
  if dropout_key is not None:
    rng_state = reseed(rng_state, dropout_key)
  return nnx.merge(parts.graphdef, params, rng_state, parts.rest)


def reseed(rng_state, key):
  """Replaces every key of an ``nnx.RngState`` tree by ``fold_in(key, i)`` (i = leaf index)."""
  leaves, treedef = jax.tree.flatten(rng_state)
  out = []
  for i, leaf in enumerate(leaves):
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      out.append(jax.random.fold_in(key, i))
    else:
      out.append(leaf)
  return jax.tree.unflatten(treedef, out)


DROPOUT_RNGS = ("threefry2x32", "rbg", "unsafe_rbg")


def dropout_base_key(dropout_seed: int, dropout_rng: str = "threefry2x32"):
  """The key every step's dropout keys are folded from (module docstring)."""
  if dropout_rng not in DROPOUT_RNGS:
    raise ValueError(f"dropout_rng must be one of {DROPOUT_RNGS}, got {dropout_rng!r}")
  return jax.random.key(dropout_seed, impl=dropout_rng)


def init_train_state(params, tx: optax.GradientTransformation) -> dict:
  return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}


# ------------------------------------------------------------------------------------------------
# Losses

def cross_entropy(logits, labels):
  """``-log softmax(logits)[label]`` ``[...]`` from logits ``[..., v]`` of any float dtype: the
  log-sum-exp (and so the softmax of the gradient) in float32."""
  x = logits.astype(jnp.float32)
  picked = jnp.take_along_axis(x, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jax.nn.logsumexp(x, axis=-1) - picked


def pretraining_loss(model, batch: dict, *, deterministic: bool, mlm_logits: str = "float32"):
  """MLM + NSP loss (see the module docstring) and metrics (sums and counts for averaging).

  ``mlm_logits``: ``"float32"`` (float32 logits over the vocabulary) or ``"padded"`` (the
  decoder's logits in the compute dtype over the vocabulary padded to a multiple of 64, the
  padding masked: ``heads_jax.model.heads.MLMHead``); the log-sum-exp is float32 either way."""
  kw = {} if mlm_logits == "float32" else {"mlm_logits": mlm_logits}
  out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
              masked_positions=batch["masked_positions"], deterministic=deterministic, **kw)
  logits = out["mlm_logits"]                                           # [b, p, v]
  labels = batch["masked_ids"]
  weights = batch["masked_weights"].astype(jnp.float32)
  nll = cross_entropy(logits, labels)                                  # [b, p]
  mlm_loss = jnp.sum(nll * weights) / (jnp.sum(weights) + 1e-5)
  nsp_logits = out["nsp_logits"].astype(jnp.float32)                    # [b, 2]
  nsp_labels = batch["next_sentence_label"]
  nsp_nll = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)
  row_w = batch.get("weights")
  row_w = jnp.ones_like(nsp_nll) if row_w is None else row_w.astype(jnp.float32)
  nsp_loss = jnp.sum(nsp_nll * row_w) / jnp.maximum(jnp.sum(row_w), 1.0)
  loss = mlm_loss + nsp_loss
  metrics = {
      "loss": loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
      "mlm_accuracy": jnp.sum((jnp.argmax(logits, -1) == labels) * weights) / (jnp.sum(weights) + 1e-5),
      "nsp_accuracy": jnp.sum((jnp.argmax(nsp_logits, -1) == nsp_labels) * row_w)
                      / jnp.maximum(jnp.sum(row_w), 1.0),
  }
  return loss, metrics


def classification_loss(model, batch: dict, *, deterministic: bool):
  """Cross-entropy over rows with ``weights`` (default all 1); metrics include predictions."""
  out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
              deterministic=deterministic)
  logits = out["logits"].astype(jnp.float32)                            # [b, c]
  labels = batch["labels"]
  w = batch.get("weights")
  w = jnp.ones(labels.shape, jnp.float32) if w is None else w.astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
  pred = jnp.argmax(logits, -1)
  metrics = {"loss": loss, "accuracy": jnp.sum((pred == labels) * w) / jnp.maximum(jnp.sum(w), 1.0)}
  return loss, metrics, pred


def _loss_only(loss_fn):
  def f(model, batch, *, deterministic):
    res = loss_fn(model, batch, deterministic=deterministic)
    return res[0], res[1]
  return f


# ------------------------------------------------------------------------------------------------
# Steps

def parse_compiler_options(text: str) -> dict:
  """``"name=value,name=value"`` (a config's ``xla_options``) -> ``{name: value}`` for
  ``jax.jit(compiler_options=...)``: ``true``/``false`` are booleans, integers are ints, the rest
  strings; ``""`` is ``{}``. Bad text: one ``UserError`` line."""
  out = {}
  for item in filter(None, (x.strip() for x in (text or "").split(","))):
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
      raise UserError(f"xla_options: {item!r} is not name=value (e.g. "
                      f"--config.xla_options=xla_gpu_enable_cublaslt=true)")
    value = value.strip()
    low = value.lower()
    out[name.strip()] = (low == "true" if low in ("true", "false") else
                         int(value) if value.lstrip("-").isdigit() else value)
  return out


def check_compiler_options(text: str) -> dict:
  """`parse_compiler_options` of ``text``, each option tried on a one-operation program of this
  XLA (milliseconds), so that an unknown option is one `UserError` line before the run starts,
  not a traceback at the step's compile."""
  options = parse_compiler_options(text)
  if options:
    try:
      jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.float32(0)).compile()
    except Exception as e:  # noqa: BLE001 (XLA's own error type: its message is what counts)
      why = str(e).splitlines()[0].replace("INVALID_ARGUMENT: ", "")
      raise UserError(f"xla_options {text!r}: {why}; correct or remove it (the names are "
                      f"XLA's DebugOptions, e.g. --config.xla_options=xla_gpu_enable_cublaslt=true)"
                      ) from None
  return options


def make_train_step(parts: ModelParts, tx: optax.GradientTransformation, loss_fn, *, mesh: Mesh,
                    schedule: Callable | None = None, accumulate_steps: int = 1,
                    dropout_seed: int = 0, dropout_rng: str = "threefry2x32",
                    donate: bool = True, compiler_options: dict | None = None):
  """``train_step(state, batch) -> (state, metrics)``, jitted over ``mesh``.

  ``loss_fn(model, batch, deterministic=...)`` returns ``(loss, metrics)`` (or a longer tuple
  whose first two items are those); metrics gain ``learning_rate`` and ``grad_norm``.
  ``dropout_rng``: the implementation of the dropout keys (module docstring).
  ``compiler_options``: XLA options of this program's compilation (``parse_compiler_options``;
  ``bench/pretrain_ab.py`` measures them per program).
  """
  loss_fn = _loss_only(loss_fn)
  replicated = NamedSharding(mesh, P())
  base_key = dropout_base_key(dropout_seed, dropout_rng)

  def step_fn(state, batch):
    step = state["step"]
    key = jax.random.fold_in(base_key, step)

    def f(params):
      model = merge_model(parts, params, key)
      return loss_fn(model, batch, deterministic=False)

    (_, metrics), grads = jax.value_and_grad(f, has_aux=True)(state["params"])
    # the scope names the update's ops in the HLO metadata (bench/profiling.py's phase)
    with jax.named_scope("optimizer"):
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      params = optax.apply_updates(state["params"], updates)
      metrics = dict(metrics)
      # the flat LAMB has the norm already (optimizer.FlatLambState): no second pass over grads
      norm = getattr(opt_state, "grad_norm", None)
      metrics["grad_norm"] = optax.global_norm(grads) if norm is None else norm
    if schedule is not None:
      metrics["learning_rate"] = schedule(step // max(1, accumulate_steps))
    return {"step": step + 1, "params": params, "opt_state": opt_state}, metrics

  return jax.jit(step_fn, out_shardings=(replicated, replicated),
                 donate_argnums=(0,) if donate else (), compiler_options=compiler_options or None)


def make_eval_step(parts: ModelParts, loss_fn, *, mesh: Mesh, with_predictions: bool = False):
  """``eval_step(params, batch) -> metrics`` (and predictions ``[b]``, sharded like the batch,
  when ``with_predictions``)."""
  replicated = NamedSharding(mesh, P())
  batch_sharded = NamedSharding(mesh, P(DATA_AXIS))

  def step_fn(params, batch):
    model = merge_model(parts, params)
    res = loss_fn(model, batch, deterministic=True)
    if with_predictions:
      return res[1], res[2]
    return res[1]

  out = (replicated, batch_sharded) if with_predictions else replicated
  return jax.jit(step_fn, out_shardings=out)


def place_state(state, mesh: Mesh):
  """A replicated copy of a train state (or params) on ``mesh`` (never aliasing the input, whose
  buffers would otherwise be deleted when the state is donated to a step)."""
  sharding = NamedSharding(mesh, P())

  def put(x):
    x = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, state)


def to_host(tree):
  """numpy copies of a pytree of arrays. Works on multi-host runs for replicated arrays (each
  process reads its own full copy) as well as for fully addressable ones."""
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if not x.sharding.is_fully_replicated:
        raise ValueError("to_host needs replicated or fully addressable arrays")
      return np.asarray(x.addressable_data(0))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)
