"""Recorders for the analysis and comparison stage kinds (`heads_jax.pipelines.stages`): the
work of each stage replaced by a callback, the keys and the engine left real, so that a test
sees exactly which units a (re)run runs."""

from pathlib import Path

from heads_jax.pipelines import analysis as analysis_lib
from heads_jax.pipelines import comparison as comparison_lib
from heads_jax.pipelines import stages


def record_stage_work(monkeypatch, *, device, host=None, compare=None) -> None:
  """``device(cfg)`` is called for each device pass that runs (instead of `device_work`),
  ``host(cfg)`` for each host statistics' run, ``compare()`` for each comparison's; their
  outputs count as intact (nothing is written)."""
  def device_work(cfg, **kw):
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    device(cfg)
    return []

  def host_work(cfg, data_info, **kw):
    if host is not None:
      host(cfg)
    return {"summary": {}, "cluster_info": {}}
  monkeypatch.setattr(analysis_lib, "device_work", device_work)
  monkeypatch.setattr(analysis_lib, "host_work", host_work)
  monkeypatch.setattr(analysis_lib, "second_pass", lambda cfg, **kw: False)
  monkeypatch.setattr(analysis_lib, "scores_intact", lambda cfg: None)
  monkeypatch.setattr(analysis_lib, "statistics_intact", lambda cfg: None)
  monkeypatch.setattr(stages, "_missing", lambda *paths: None)
  def comparison_work(a, b, dest):
    Path(dest).mkdir(parents=True, exist_ok=True)
    return (compare() if compare else None) or []

  def report_work(before, after, dest, **kw):
    (Path(dest) / "report.html").write_text("")
    return Path(dest) / "report.html"
  monkeypatch.setattr(comparison_lib, "comparison_work", comparison_work)
  monkeypatch.setattr(comparison_lib, "report_work", report_work)
  monkeypatch.setattr(comparison_lib, "report_lines", lambda out: [])
