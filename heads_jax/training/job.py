"""The skeleton every training job shares (pre-training and fine-tuning).

``TrainingJob(config, workdir)`` holds what both set up the same way, in the order they use it:

1. the host processes (``jax.distributed`` as ``config.distributed`` says:
   ``heads_jax.parallel.initialize_from_config``), the work directory (``RunDir``: every path
   of the run, a local folder or a ``gs://`` URL) and the one-axis ``data`` mesh over all
   devices of all processes, with ``config.batch_size`` checked against it;
2. the optimizer and its learning-rate schedule (``make_tx``: LAMB or AdamW with the BERT
   conventions, from ``config.optimizer``);
3. ``init_model``: the model a run starts from (``config.init_checkpoint`` when it is a model
   directory, else freshly initialised from ``config.model`` with ``config.seed``);
4. ``initial_state``: the train state, from the run's own latest checkpoint (resume), another
   run's parameters, or the model (``heads_jax.training.loop.initial_state``), and the Orbax
   checkpoint manager of ``workdir/checkpoints``;
5. ``train_step`` / ``eval_step``: the jitted steps over the mesh;
6. ``train``: the loop with its throughput meter (tokens/s, MFU) and metrics writer, closing
   the checkpoint manager, the writer and the batch stream however it ends: SIGTERM and Ctrl-C
   are flags the loop reads after each step's host work, so the step they land in is saved, then
   the run exits with 143 (SIGTERM) or 130 (Ctrl-C); a second signal of either stops at once,
   also in a long evaluation, after the save in flight is finished; a failed save,
   asynchronous or not (a full disk), stops the run at once with one line naming the checkpoint
   (the partial save removed, the previous one intact);
   in cloud storage the writer's uploads wait for Orbax's finalisation (never concurrent on one
   filesystem object: the hang of issue 28);
7. ``export``: the final model as a heads_jax and a Hugging Face directory (written locally and
   copied to the work directory when that is a URL).

The settings, the environment variables (``heads_jax.env.require_valid``) and the names in
``XLA_FLAGS`` (``heads_jax.xla_flags.require_known``) are checked before any device work
(``configlib.check_training_config``).
``create_dir`` locks the work directory (``heads_jax.runfiles.WorkdirLock``: a second
process gets one line naming the first; released by ``close``) and compares the config with the
one the run was started with (``configlib.check_resume``: another task or model is refused,
other changed settings unless ``--config.allow_changes``; ``config.json`` keeps the first
config, changes are appended to ``config_changes.jsonl``). ``check_data`` does the same for the
training data's content (``data_identity``: the rows of a fine-tuning run, the files of a
pre-training corpus, through ``heads_jax.runfiles.fingerprint``), kept in ``data_identity.json``:
a resume on other data is refused unless ``--config.allow_changes``, and the change recorded.

What differs between the jobs (data, losses, what an evaluation computes) stays in
``pretrain.py`` and ``finetune.py``.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import sys
import weakref

import jax

from heads_jax.storage import display, exists as storage_exists, read_text, staged_output, write_text
from heads_jax.errors import UserError
from heads_jax.model.checkpoint import build_model, save_model
from heads_jax.model.config import config_for
from heads_jax.model.convert import export_hf
from heads_jax.parallel import data_mesh, initialize_from_config
from heads_jax import env, runfiles, xla_flags
from heads_jax.runfiles import WorkdirLock
from heads_jax.training import checkpointing, configlib, loop, metrics as metrics_lib, optimizer, steps
from heads_jax.training.rundir import RunDir

ARCHITECTURES = {"pretraining": "BertForPreTraining", "classification": "BertForSequenceClassification",
                 "question-answering": "BertForQuestionAnswering"}

# The newest checkpoint is known to be good only once the next step's loss is finite (see
# heads_jax.training.loop), so a run keeps at least two.
MIN_CHECKPOINTS_KEPT = 2


def make_tx(config):
  """``(tx, schedule)`` from ``config.optimizer``; the schedule counts optimizer updates
  (``num_train_steps // accumulate_steps`` of them)."""
  o = config.optimizer
  k = max(1, o.accumulate_steps)
  return optimizer.make_optimizer(
      learning_rate=o.learning_rate, warmup_steps=o.warmup_steps,
      total_steps=max(1, config.num_train_steps // k), weight_decay=o.weight_decay, b1=o.b1,
      b2=o.b2, eps=o.eps, clip_norm=o.clip_norm, accumulate_steps=k,
      end_learning_rate=o.end_learning_rate, power=o.power, name=o.name,
      flat=bool(o.get("flat", False)))


class TrainingJob:
  """One training run's shared set-up and bookkeeping (see the module docstring)."""

  def __init__(self, config, workdir):
    env.require_valid()  # a variable every later step would stop on: refused now, one line
    xla_flags.require_known()  # an unknown XLA flag: one line, not XLA's fatal one later
    configlib.check_training_config(config)
    initialize_from_config(config.distributed)
    steps.check_compiler_options(config.get("xla_options", ""))  # before any work: one line
    self.config = config
    self.dir = RunDir(workdir)
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.is_main = self.process_index == 0
    self.mesh = data_mesh()
    self.num_devices = self.mesh.devices.size
    if config.batch_size % self.num_devices:
      raise UserError(f"batch_size {config.batch_size} is not divisible by the {self.num_devices} "
                      f"devices; use a multiple of {self.num_devices}")
    self.tx, self.schedule = make_tx(config)
    self.ckpts: checkpointing.Checkpoints | None = None
    self.parts = None
    self.model_config = None
    self.start_step, self.origin = 0, "fresh"
    self._lock: WorkdirLock | None = None

  def print(self, *args) -> None:
    """``print`` on the main process only."""
    if self.is_main:
      print(*args, flush=True)

  def create_dir(self) -> None:
    """Locks and creates the work directory and writes ``config.json`` (main process): a run
    started earlier there is checked first (``configlib.check_resume``; nothing is written
    when refused)."""
    if not self.is_main:
      self.dir.create()
      return
    task = self.config.get("task") or None  # what the directory is (heads_jax.runfiles.claim_dir)
    kind = "finetuning" if task else "pretraining"
    runfiles.check_dir(self.dir.root, kind, flag="--workdir", task=task)
    self._lock = WorkdirLock(self.dir.root, "a training run").acquire()
    weakref.finalize(self, self._lock.release)
    try:
      resumable = any(checkpointing.is_orbax_run_dir(d) for d in (self.dir.checkpoints,
                                                                  self.dir.best))
      changes = configlib.check_resume(self.config, self.dir.config_file,
                                       self.dir.config_changes_file, resumable=resumable)
    except BaseException:
      self.close()
      raise
    self.dir.create()
    runfiles.claim_dir(self.dir.root, kind, flag="--workdir", task=task,
                       model=self.config.get("init_checkpoint") or None)
    if changes is None:
      configlib.save_config(self.config, self.dir.config_file)
    self._changes = changes or None   # recorded once the restore succeeded (`initial_state`)

  def check_data(self, identity: dict) -> None:
    """Compares ``identity`` (the training data's content: ``{part: digest}``, e.g. from
    `rows_identity` or `files_identity`) with the one this run was trained on
    (``data_identity.json``) and writes it. Other data on a resume is refused (one line naming
    the changed parts) unless ``config.allow_changes``, when the change is appended to
    ``config_changes.jsonl``. Every process first checks that it reads the same data as
    process 0 (``same_data_on_every_process``). Call it after ``create_dir``."""
    self.same_data_on_every_process(identity)
    if not self.is_main:
      return
    file = self.dir.data_identity_file
    old = _read_identity(file) if storage_exists(file) else None
    if old == identity:
      return
    resumable = any(checkpointing.is_orbax_run_dir(d) for d in (self.dir.checkpoints,
                                                                self.dir.best))
    if old is not None and resumable and sorted(old.values()) != sorted(identity.values()):
      changed = [k for k, v in identity.items() if v not in old.values()]
      changed += [f"{k} (gone)" for k, v in old.items() if v not in identity.values()
                  and k not in identity]
      what = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
      if not self.config.get(configlib.ALLOW_CHANGES, False):
        self.close()
        raise UserError(f"{self.dir}: this run was trained on other data (changed since: "
                        f"{what}); resuming would continue on other examples: restore the data, "
                        f"choose another --workdir, or pass --config.allow_changes=true to resume "
                        f"on the new data (recorded)")
      configlib.record_changes(self.dir.config_changes_file, {}, data={"before": old,
                                                                        "now": identity})
      self.print(f"resuming on changed data (recorded in {display(self.dir.config_changes_file)}"
                 f"): {what}")
    write_text(file, json.dumps(identity, indent=2))

  def same_data_on_every_process(self, identity: dict) -> None:
    """On several host processes: refuses (on all of them, one line naming the processes) a run
    whose hosts read different training data (the digests of ``identity``'s contents differ
    from process 0's), which would train every host on other examples without a word."""
    if self.process_count == 1:
      return
    import numpy as np
    from jax.experimental import multihost_utils
    digest = np.frombuffer(hashlib.sha256(json.dumps(sorted(map(str, identity.values())))
                                          .encode()).digest(), np.uint8)
    main = np.asarray(multihost_utils.broadcast_one_to_all(digest))
    agree = np.asarray(multihost_utils.process_allgather(np.asarray(np.array_equal(main, digest))))
    bad = [i for i, ok in enumerate(np.ravel(agree)) if not ok]
    if bad:
      self.close()
      raise UserError(f"the training data differ between the hosts: process(es) "
                      f"{', '.join(map(str, bad))} read other files than process 0; give every "
                      f"host the same data (the same paths with the same content)")

  def close(self) -> None:
    """Releases the work directory (the lock of ``create_dir``)."""
    if self._lock is not None:
      self._lock.release()

  def init_model(self, head: str, tokenizer, *, num_labels: int | None = None):
    """The model the run starts from: ``config.init_checkpoint`` when it is a heads_jax or
    Hugging Face model directory (heads it lacks freshly initialised), else a fresh
    ``config.model`` of the tokenizer's vocabulary. Its embedding table must hold every id of
    the tokenizer (it may hold more rows)."""
    c = self.config
    model = loop.load_init_model(c.init_checkpoint, head, num_labels=num_labels, dtype=c.model.dtype)
    if model is None:
      m = c.model
      cfg = config_for(m.size, vocab_size=tokenizer.vocab_size, dtype=m.dtype,
                       hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
                       max_position_embeddings=m.max_position_embeddings,
                       dropout_bits=m.get("dropout_bits", 32))
      model = build_model(ARCHITECTURES[head], cfg, num_labels, seed=c.seed)
    # A table larger than the tokenizer is common (DeBERTa-v3: 128100 rows for 128001 pieces);
    # a tokenizer id past the table is what breaks a run.
    if len(tokenizer) > model.config.vocab_size:
      raise UserError(f"model vocabulary ({model.config.vocab_size}) and tokenizer "
                      f"({len(tokenizer)}) differ: the tokenizer has ids the model cannot embed; "
                      f"set config.tokenizer to the model's tokenizer")
    return model

  def initial_state(self, model, *, init_subtree: str | None = None):
    """The train state to start from (see ``loop.initial_state``); opens the run's checkpoint
    manager and sets ``parts``, ``model_config``, ``start_step`` and ``origin``."""
    c = self.config.checkpoint
    self.ckpts = checkpointing.Checkpoints(self.dir.checkpoints, save_interval_steps=c.every_steps,
                                           max_to_keep=(None if c.keep == 0 else  # 0: all
                                                        max(MIN_CHECKPOINTS_KEPT, c.keep)),
                                           async_save=c.async_save)
    self.model_config = model.config
    self.parts, state, self.start_step, self.origin = loop.initial_state(
        model=model, tx=self.tx, mesh=self.mesh, ckpts=self.ckpts,
        init_checkpoint=self.config.init_checkpoint, init_subtree=init_subtree)
    self.record_changes()  # only now: a resume that fails records no change
    return state

  def record_changes(self) -> None:
    """Records the changed settings `create_dir` accepted (``allow_changes``), once the resume
    has restored its checkpoints: a failed restore leaves the run's settings as they were, so
    the original command is not refused afterwards with a false claim."""
    changes, self._changes = getattr(self, "_changes", None), None
    if changes and self.is_main:
      configlib.record_changes(self.dir.config_changes_file, changes)
      self.print(f"resuming with changed settings (recorded in "
                 f"{display(self.dir.config_changes_file)}): " +
                 ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()))

  def train_step(self, loss_fn):
    return steps.make_train_step(self.parts, self.tx, loss_fn, mesh=self.mesh,
                                 schedule=self.schedule,
                                 accumulate_steps=self.config.optimizer.accumulate_steps,
                                 dropout_seed=self.config.dropout_seed,
                                 dropout_rng=self.config.get("dropout_rng", "threefry2x32"),
                                 compiler_options=steps.parse_compiler_options(
                                     self.config.get("xla_options", "")))

  def eval_step(self, loss_fn, *, with_predictions: bool = False):
    return steps.make_eval_step(self.parts, loss_fn, mesh=self.mesh,
                                with_predictions=with_predictions)

  def train(self, state, train_step, batches, *, seq_len: int, eval_fn=None, meta: dict):
    """Runs ``loop.train_loop`` from ``start_step`` to ``config.num_train_steps`` (or
    ``stop_at_step``); returns ``(state, history)``. ``meta`` is stored with every checkpoint
    (with ``step``). Closes the checkpoint manager, the metrics writer and ``batches``; on any
    error (a failed save, a non-finite loss, a signal) it also releases the work directory
    (``close``) before raising, so no lock waits for the interpreter's exit.

    A loss that is not finite raises a UserError naming the last good checkpoint and what to
    change."""
    try:
      return self._train(state, train_step, batches, seq_len=seq_len, eval_fn=eval_fn,
                         meta=meta)
    except BaseException:
      self.close()
      raise

  def _train(self, state, train_step, batches, *, seq_len: int, eval_fn, meta: dict):
    c = self.config
    cfg = self.model_config
    n_params = metrics_lib.non_embedding_params(state["params"])
    fpt = metrics_lib.train_flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, seq_len)
    throughput = metrics_lib.Throughput(c.batch_size * seq_len, fpt, self.num_devices,
                                        jax.devices()[0].device_kind, c.num_train_steps,
                                        self.start_step)
    # Remote: the writer's uploads wait for Orbax's finalisation (both use fsspec's event loop
    # and one filesystem object; concurrent, they hung in issue 28).
    writer = metrics_lib.MetricsWriter(self.dir, enabled=self.is_main, tensorboard=c.tensorboard,
                                       before_upload=self.ckpts.wait if self.dir.is_remote else None)
    # SIGTERM and Ctrl-C are flags (no exception inside Orbax's threads) from here until the
    # checkpoints are closed: the loop saves the step a signal lands in and returns.
    with loop.StopFlag() as flag:
      try:
        result = loop.train_loop(
            state=state, train_step=train_step, batches=iter(batches), mesh=self.mesh,
            start_step=self.start_step, total_steps=c.num_train_steps, ckpts=self.ckpts,
            writer=writer, throughput=throughput, log_every=c.log_every, eval_every=c.eval_every,
            eval_fn=eval_fn, meta_fn=lambda s: {"step": s, **meta}, stop_at_step=c.stop_at_step,
            print_fn=print if self.is_main else None, stop_flag=flag)
      except loop.NonFiniteLoss as e:
        self._close_all(batches, writer)
        lr = c.optimizer.learning_rate
        raise UserError(f"{e}; lower the learning rate (now {lr:g}, e.g. "
                        f"--config.optimizer.learning_rate={lr / 4:g}) or lengthen the warm-up "
                        f"(--config.optimizer.warmup_steps), or check the data") from None
      except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM
        # Finish the save in flight (an abandoned one ends in asyncio tracebacks at exit).
        self._close_all(batches, writer)
        term = flag.second == "SIGTERM"
        self._stop(143 if term else 130,
                   f"{'stopped by a second SIGTERM' if term else 'interrupted (Ctrl-C)'}; "
                   f"{self.ckpts.note()}; run the same command again to resume")
      except Exception as e:
        self._close_all(batches, writer)
        self._save_failed(e)
        raise
      error = self._close_all(batches, writer)
    if error is not None:
      self._save_failed(error)
      raise error
    if flag.stop:
      what = ("stopped by SIGTERM" if flag.signal == "SIGTERM" else "interrupted (Ctrl-C)")
      self._stop(143 if flag.signal == "SIGTERM" else 130,
                 f"{what} after saving; {self.ckpts.note()}; run the same command again to "
                 f"resume")
    return result

  def _close_all(self, batches, writer) -> BaseException | None:
    """Closes the batch stream, the checkpoints (waiting for the save in flight) and the
    writer, each however the others end; returns the first error."""
    first = None
    for close in (getattr(batches, "close", None), self.ckpts.close, writer.close):
      if close is None:
        continue
      try:
        close()
      except BaseException as e:  # noqa: BLE001 (reported once, below)
        first = first or e
    return first

  def _save_failed(self, error: BaseException) -> None:
    """A failed save (``checkpointing.SaveFailed``, or a full disk while writing anything): one
    ``UserError`` line naming what was written, the partial save removed."""
    if not (_no_space(error) or isinstance(error, checkpointing.SaveFailed)):
      return
    removed = self.ckpts.remove_partial()
    partial = f"; removed the partial save {', '.join(removed)}" if removed else ""
    cause = error.cause if isinstance(error, checkpointing.SaveFailed) else error
    if isinstance(error, checkpointing.SaveFailed):
      what = (f"the checkpoint of step {error.step} ({display(self.ckpts.directory / str(error.step))})"
              if error.step is not None else f"a checkpoint ({display(self.ckpts.directory)})")
    else:
      what = "its files"
    if _no_space(error):
      raise UserError(f"no space left on the device of {self.dir} while writing {what} "
                      f"({cause}); {self.ckpts.note()} (intact{partial}); free some space and "
                      f"run the same command again") from None
    raise UserError(error.line(f" (intact{partial})")) from None

  def _stop(self, code: int, line: str) -> None:
    self.close()
    if self.is_main:
      sys.stdout.flush()
      print(f"heads-jax: {line}", file=sys.stderr, flush=True)
    raise SystemExit(code)

  def export(self, params, tokenizer, model_dir: str, hf_dir: str, *,
             id2label: dict | None = None) -> dict:
    """Writes the model with ``params`` to ``workdir/model_dir`` (heads_jax) and
    ``workdir/hf_dir`` (Hugging Face); returns both paths."""
    model = steps.merge_model(self.parts, steps.to_host(params))
    writers = (("heads_jax model", model_dir,
                lambda out: save_model(model, out, tokenizer, id2label=id2label)),
               ("Hugging Face model", hf_dir,
                lambda out: export_hf(model, tokenizer, out, id2label=id2label)))
    for what, sub, write in writers:
      target = self.dir.sub(sub)
      try:
        with staged_output(target, fetch_existing=False) as local:
          write(local)
      except Exception as e:  # a full disk (safetensors says it in a SafetensorError): one line
        if not _no_space(e):
          raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise UserError(f"no space left on the device while writing the {what} to "
                        f"{display(target)} ({first}); the run's checkpoints are intact: free "
                        f"some space and run the same command again (it exports without "
                        f"training again)") from None
    return {"heads_jax": display(self.dir.sub(model_dir)), "hf": display(self.dir.sub(hf_dir))}

  def best_checkpoints(self, state):
    """``(best_ckpts, best)``: the manager of ``workdir/best`` (the best evaluation's parameters,
    one kept) and the record of that evaluation (``{"score": -inf}`` when none is kept yet; read
    back on a resume)."""
    best_ckpts = checkpointing.Checkpoints(self.dir.best, save_interval_steps=1, max_to_keep=1,
                                           async_save=False)
    best = {"score": -float("inf")}
    if best_ckpts.latest_step() is not None:
      _, meta = best_ckpts.restore({"params": checkpointing.abstract_like(state["params"])})
      best = meta.get("best", best)
    return best_ckpts, best

  def export_best(self, state, best_ckpts, best: dict, tokenizer, *,
                  id2label: dict | None = None) -> tuple[dict, dict]:
    """After a finished run (``config.export``): the best checkpoint's parameters (or the last
    ones when none was kept) exported to ``best_model`` and ``best_hf``; returns
    ``(exports, best)`` with ``best`` as the restored checkpoint records it."""
    done = int(steps.to_host(state["step"]))
    if done < self.config.num_train_steps or not self.config.export:
      return {}, best
    params = state["params"]
    if best_ckpts.latest_step() is not None:
      restored, meta = best_ckpts.restore({"params": checkpointing.abstract_like(params)})
      params, best = restored["params"], meta.get("best", best)
    exports = (self.export(params, tokenizer, "best_model", "best_hf", id2label=id2label)
               if self.is_main else {})
    return exports, best


def _read_identity(file) -> dict:
  """``data_identity.json`` (local or a URL); a damaged one is one line naming it and the fix."""
  try:
    old = json.loads(read_text(file))
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{display(file)} is not valid JSON ({e}); it records the data this run was "
                    f"trained on: restore it, or remove it to record the current data (the "
                    f"check is then skipped once)") from None
  if not isinstance(old, dict):
    raise UserError(f"{display(file)} does not hold a data identity (a JSON object); restore it, "
                    f"or remove it to record the current data") from None
  return old


def rows_identity(**parts) -> dict:
  """``{part: sha256}`` of examples in memory (``part=list of dataclass rows``, e.g.
  ``train=..., eval=...``): the content a fine-tuning run trains and evaluates on, whatever
  files or data set they came from."""
  out = {}
  for name, rows in parts.items():
    h = hashlib.sha256()
    for r in rows:
      h.update(json.dumps(dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r,
                          sort_keys=True, default=str).encode())
      h.update(b"\n")
    out[name] = f"{len(rows)} rows, sha256 {h.hexdigest()}"
  return out


def files_identity(paths, *, cache=None) -> dict:
  """``{file: "size, sha256"}`` of local files or folders (every file inside), by
  ``heads_jax.runfiles.fingerprint``: the same content under another path is the same data (the
  digests are compared, the names only label a change)."""
  out = {}
  for p in map(str, paths):
    for rel, size, digest in runfiles.fingerprint(p, cache=cache):
      label = p if os.path.isfile(p) else f"{p.rstrip('/')}/{rel}"
      out[label] = f"{size} bytes, sha256 {digest}"
  return out


def _no_space(error: BaseException) -> bool:
  """Whether ``error`` (or what caused it) is a full disk (ENOSPC)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return True
    if any(t in str(error) for t in ("No space left on device", "StorageFull", "os error 28")):
      return True
    error = error.__cause__ or error.__context__
  return False
