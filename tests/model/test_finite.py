"""Weights are checked at load (issue 34): a NaN or infinite value in a heads_jax model directory,
a Hugging Face directory or another run's Orbax checkpoint (a fine-tuning's init_checkpoint) is
one UserError line naming the tensor and the file, before any work."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from heads_jax import load_model
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import save_model
from heads_jax.model.config import config_for
from heads_jax.model.convert import export_hf
from heads_jax.model.heads import BertForSequenceClassification
from heads_jax.training import checkpointing, loop

CFG = config_for("tiny", vocab_size=97, max_position_embeddings=32)


def _plant(file, key, value, index=(0, 1)):
  tensors = load_file(str(file))
  a = tensors[key].copy()
  a[index] = value
  tensors[key] = a
  save_file(tensors, str(file))


def _model():
  return BertForSequenceClassification(CFG, num_labels=2, rngs=nnx.Rngs(0))


def test_a_nan_in_a_heads_jax_model_is_named_with_its_file(tmp_path):
  save_model(_model(), tmp_path / "m")
  load_model(tmp_path / "m", head="classification", with_tokenizer=False)  # clean: loads
  _plant(tmp_path / "m" / "params.safetensors", "bert/layers/1/attention/query/kernel", np.nan)
  message = (f"{tmp_path / 'm' / 'params.safetensors'}: tensor bert/layers/1/attention/query/kernel "
             f"holds 1 NaN and 0 infinite value(s) of {CFG.hidden_size * CFG.hidden_size}: these "
             f"weights are damaged")
  for head in (None, "classification"):
    with pytest.raises(UserError) as e:
      load_model(tmp_path / "m", head=head, with_tokenizer=False)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
  with pytest.raises(UserError, match="tensor bert/layers/1/attention/query/kernel holds 1 NaN"):
    loop.load_init_model(str(tmp_path / "m"), "classification", num_labels=2)


def test_an_inf_in_a_hugging_face_model_is_named_with_its_file(tmp_path):
  export_hf(_model(), None, tmp_path / "hf")
  key = "bert.encoder.layer.0.output.dense.bias"
  _plant(tmp_path / "hf" / "model.safetensors", key, -np.inf, index=(3,))
  with pytest.raises(UserError) as e:
    load_model(tmp_path / "hf", with_tokenizer=False)
  assert str(e.value).startswith(f"{tmp_path / 'hf' / 'model.safetensors'}: tensor {key} holds "
                                 f"0 NaN and 1 infinite value(s) of {CFG.hidden_size}")


def test_a_nan_in_an_init_run_is_named_before_fine_tuning(tmp_path):
  ckpts = checkpointing.Checkpoints(tmp_path / "ck", save_interval_steps=1)
  w = jnp.zeros((8, 4)).at[2, 3].set(jnp.nan)
  ckpts.save(5, {"step": jnp.int32(5), "params": {"bert": {"w": w}, "head": jnp.ones(3)}})
  ckpts.close()
  target = checkpointing.abstract_like({"head": jnp.ones(3)})  # the clean part restores
  params, step = checkpointing.restore_params_from_run(tmp_path / "ck", target)
  assert step == 5 and float(params["head"][0]) == 1.0
  with pytest.raises(UserError) as e:
    checkpointing.restore_params_from_run(
        tmp_path / "ck", checkpointing.abstract_like({"bert": {"w": w}}))
  assert str(e.value).startswith(f"init_checkpoint {tmp_path / 'ck' / '5'}: tensor bert/w holds 1 "
                                 f"NaN and 0 infinite value(s) of 32")
