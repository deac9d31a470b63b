"""One host process of the 2-process tests (tests/e2e/test_multihost.py), run as a script:

    python tests/multihost_worker.py PHASE PROCESS_ID NUM_PROCESSES PORT ROOT

4 CPU devices per process (``XLA_FLAGS``, set before jax is imported), joined through
``jax.distributed`` with a coordinator on ``127.0.0.1:PORT`` (the config's ``distributed``
block) and the gloo CPU collectives. PHASE ``first``: pre-train the tiny preset into
``ROOT/pt`` and stop after step 4. PHASE ``second``: the same command again (it resumes), then
fine-tune from its checkpoints into ``ROOT/ft`` and analyse its exported model into
``ROOT/heads``. Each process writes what it saw to ``ROOT/PHASE_PROCESS_ID.json``.
"""

from __future__ import annotations

import json
import os
import sys

DEVICES_PER_PROCESS = 4


def tiny_pretrain_overrides(**kw) -> list[str]:
  """The tiny pre-training run of these tests (6 steps of 16 x 32), as config overrides."""
  base = {"data.max_seq_length": 32, "data.max_predictions": 5, "batch_size": 16,
          "num_train_steps": 6, "optimizer.warmup_steps": 2, "checkpoint.every_steps": 2,
          "checkpoint.keep": 2, "log_every": 1, "eval_batches": 0, "export": True,
          "tensorboard": False}
  base.update(kw)
  return [f"{k}={v}" for k, v in base.items()]


def finetune_overrides(init: str) -> list[str]:
  return ["num_train_steps=3", "eval_every=3", "log_every=1", "data.max_examples=96",
          "eval_batch_size=32", "tensorboard=False", "checkpoint.every_steps=3",
          f"init_checkpoint={init}"]


def analysis_config(model, out):
  from heads_jax.pipelines.analyze import AnalysisConfig
  return AnalysisConfig(model=str(model), data=("ud-ewt",), out=str(out), max_examples=12,
                        batch_size=8, measures=False, report=False, clusters=2)


def distributed_overrides(process_id: int, num_processes: int, port: int) -> list[str]:
  return [f"distributed.coordinator_address=127.0.0.1:{port}",
          f"distributed.num_processes={num_processes}", f"distributed.process_id={process_id}"]


def main(argv):
  phase, pid, nproc, port, root = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
  os.environ["JAX_PLATFORMS"] = "cpu"
  from heads_jax.pipelines.analyze import run_analysis
  from heads_jax.training import configlib, finetune, pretrain

  dist = distributed_overrides(pid, nproc, port)
  out = {"process_index": pid}
  if phase == "first":
    c = configlib.load_config("configs/pretrain.py:tiny",
                              tiny_pretrain_overrides(stop_at_step=4) + dist)
    s = pretrain.train_and_evaluate(c, os.path.join(root, "pt"))
    out["pretrain"] = {k: s[k] for k in ("history", "start_step", "final_step", "origin")}
  else:
    c = configlib.load_config("configs/pretrain.py:tiny", tiny_pretrain_overrides() + dist)
    s = pretrain.train_and_evaluate(c, os.path.join(root, "pt"))
    out["pretrain"] = {k: s[k] for k in ("history", "start_step", "final_step", "origin")}
    import jax
    out["process_count"], out["device_count"] = jax.process_count(), jax.device_count()
    c = configlib.load_config("configs/finetune.py:tiny_sst2",
                              finetune_overrides(os.path.join(root, "pt", "checkpoints")) + dist)
    f = finetune.train_and_evaluate(c, os.path.join(root, "ft"))
    out["finetune"] = {"history": f["history"], "best": f["best"], "final_eval": f["final_eval"]}
    res = run_analysis(analysis_config(os.path.join(root, "pt", "model"),
                                       os.path.join(root, "heads")),
                       progress=False, log=lambda *a: None)
    out["analysis"] = {"process_index": res.get("process_index", 0)}
  with open(os.path.join(root, f"{phase}_{pid}.json"), "w") as fh:
    json.dump(out, fh, default=str)
  return 0


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main(sys.argv[1:]))
