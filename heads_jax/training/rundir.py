"""The work directory of a training run: every path in it, named in one place.

    workdir/config.json       the config the run was started with    (RunDir.config_file)
    workdir/config_changes.jsonl  settings changed on a resume (--config.allow_changes)
                                                                     (RunDir.config_changes_file)
    workdir/.heads_jax.lock   while a process runs in it (heads_jax.runfiles.WorkdirLock)
    workdir/data.json         fine-tuning: which rows were used      (RunDir.data_file)
    workdir/data_identity.json  the training data's content (a resume on other data is refused)
                                                                     (RunDir.data_identity_file)
    workdir/summary.json      fine-tuning: the run's summary         (RunDir.summary_file)
    workdir/metrics.jsonl     train and eval scalars                 (RunDir.metrics_file)
    workdir/tb/               TensorBoard events                     (RunDir.tensorboard_dir)
    workdir/checkpoints/      Orbax checkpoints of the train state   (RunDir.checkpoints)
    workdir/best/             fine-tuning: the best evaluation's parameters (RunDir.best)
    workdir/model/, hf/       pre-training exports (heads_jax, Hugging Face)
    workdir/best_model/, best_hf/  fine-tuning exports of the best evaluation

Every training module takes its paths from here. The work directory may be a local folder or a
cloud URL (``gs://bucket/run``): every path here is an ``etils.epath.Path``
(``heads_jax.storage.as_path``), so a URL stays a URL (never resolved as a local path) and
Orbax, the metrics writer and the exports reach it through ``epath``.
"""

from __future__ import annotations

from etils import epath

from heads_jax.storage import as_path, display, is_url, makedirs


class _Under:
  """A read-only attribute of `RunDir`: the path ``name`` under the run's root."""

  def __init__(self, name: str):
    self.name = name

  def __set_name__(self, owner, attribute: str):
    self.attribute = attribute

  def __get__(self, run, owner=None):
    return self if run is None else run.root / self.name

  def __set__(self, run, value):
    raise AttributeError(f"RunDir.{self.attribute} is the fixed path {self.name!r} under the root")


class RunDir:
  """The paths of one run's work directory (see the module docstring); each is an
  ``epath.Path`` under ``root``."""

  config_file = _Under("config.json")
  config_changes_file = _Under("config_changes.jsonl")
  data_file = _Under("data.json")
  data_identity_file = _Under("data_identity.json")
  summary_file = _Under("summary.json")
  metrics_file = _Under("metrics.jsonl")
  tensorboard_dir = _Under("tb")
  checkpoints = _Under("checkpoints")
  best = _Under("best")

  def __init__(self, root):
    self.root = root.root if isinstance(root, RunDir) else as_path(root)

  def __repr__(self) -> str:
    return f"RunDir({display(self.root)!r})"

  def __str__(self) -> str:
    return display(self.root)

  @property
  def is_remote(self) -> bool:
    """Whether the run lives in cloud storage (a URL)."""
    return is_url(self.root)

  def create(self) -> "RunDir":
    makedirs(self.root)
    return self

  def sub(self, name: str) -> epath.Path:
    """``workdir/name`` (an export directory, e.g. ``model`` or ``best_hf``)."""
    return self.root / name
