"""Figure and section specs of the reports, and the registries they live in (one per paper).

A figure is ONE `Figure` spec: its name, title, caption, "how to read this" line, draw function,
the report(s) and section it belongs to, and which paper / figure it reproduces. Each paper module
under `heads_jax.report.figures` holds a `Registry` (``FIGURES``) and registers its figures there
once; the reports (analysis, compare, ablation, measures, reproduce, index) ask `figures_for`
which figures they show and `draw` them, the way big_vision lists ``config.evals.<name>.type`` and
builds each evaluator in ``evaluators/common.py``. A paper module declares its figures as one table
(`Registry.register_all`: ``{name: {field: value}}``, the fields of `Figure`); adding a figure is one
entry there.
A `Section` (``Registry.section``) gives a section that holds registered figures its paragraph.

A draw function is ``draw(inputs, path, *, title, dpi) -> Path | None``: `Inputs` holds what the
report has (missing entries read as None); it draws a PNG at ``path`` and returns it, or returns
None when the inputs lack what the figure needs (the report leaves the figure out). Inputs a figure
cannot do without are its spec's ``needs``: its ``draw`` returns None when any of them is missing,
before the draw function is called. No jax.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable, Iterator

REPORTS = ("analysis", "compare", "ablation", "measures", "reproduce", "index")


class Inputs(dict):
  """What a report hands to the draw functions: a dict whose entries also read as attributes
  (a missing entry reads as None)."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return self.get(name)


@dataclasses.dataclass(frozen=True)
class Figure:
  """One figure of the reports (module docstring).

  Attributes:
    name: unique name; also the PNG's file name (``<name>.png``) in the report's figures folder.
    title, caption, how: the heading, what is drawn, and how to read it.
    draw: ``draw(inputs, path, *, title, dpi) -> Path | None``.
    reports: the reports (`REPORTS`) that show it.
    section: the section of those reports it appears in.
    reproduces: the paper's figure it reproduces ("Fig. 3a"), "" when none.
    needs: inputs the figure cannot be drawn without: ``draw`` returns None, without calling the
      draw function, when any of them is missing (None).
    rule_in_title: the drawn title names the role rule (``inputs.rule``), for figures drawn from
      the role decisions.
    paper: the paper (filled in by the `Registry`).
  """
  name: str
  title: str
  caption: str
  how: str
  draw: Callable[..., Path | None]
  reports: tuple[str, ...]
  section: str = "Figures"
  reproduces: str = ""
  rule_in_title: bool = False
  needs: tuple[str, ...] = ()
  paper: str = ""

  def __post_init__(self):
    unknown = [r for r in self.reports if r not in REPORTS]
    if unknown or not self.reports:
      raise ValueError(f"figure {self.name!r}: reports must be some of {REPORTS}, got "
                       f"{self.reports!r}")
    if self.needs:
      object.__setattr__(self, "draw", _when_given(self.draw, tuple(self.needs)))

  @property
  def text(self) -> tuple[str, str, str]:
    """``(title, caption, how)``."""
    return self.title, self.caption, self.how

  def drawn_title(self, inputs: Inputs) -> str:
    rule = inputs.get("rule") if self.rule_in_title else None
    return self.title + (f" ({rule} rule)" if rule else "")


def _when_given(draw, needs: tuple[str, ...]):
  """``draw`` that returns None when an input of ``needs`` is missing."""
  @functools.wraps(draw)
  def drawn(inputs, path, **kw):
    if any(inputs.get(name) is None for name in needs):
      return None
    return draw(inputs, path, **kw)
  return drawn


@dataclasses.dataclass(frozen=True)
class Section:
  """A section of a report that holds registered figures (`Figure.section`): its title and the
  paragraph above its figures (trusted HTML)."""
  report: str
  title: str
  intro: str = ""


class Registry:
  """The figures of one paper, in the order they were registered."""

  def __init__(self, paper: str):
    self.paper = paper
    self._figures: dict[str, Figure] = {}
    self._sections: dict[tuple[str, str], Section] = {}

  def section(self, report: str, title: str, intro: str = "") -> Section:
    """Registers the `Section` ``title`` of ``report`` (its figures name it as ``section``)."""
    sec = Section(report, title, intro)
    self._sections[(report, title)] = sec
    return sec

  def sections(self) -> list[Section]:
    return list(self._sections.values())

  def unregister_section(self, report: str, title: str) -> None:
    self._sections.pop((report, title))

  def register(self, name: str, **fields) -> Figure:
    """Registers ``Figure(name=name, paper=self.paper, **fields)``; names are unique across all
    registries (checked by `all_figures`)."""
    if name in self._figures:
      raise ValueError(f"figure {name!r} is already registered for {self.paper}")
    fig = Figure(name=name, paper=self.paper, **fields)
    self._figures[name] = fig
    return fig

  def register_all(self, table: dict[str, dict]) -> None:
    """Registers every figure of ``table`` (``{name: {field: value}}``, `register`), in order."""
    for name, fields in table.items():
      self.register(name, **fields)

  def unregister(self, name: str) -> None:
    self._figures.pop(name)

  def __iter__(self) -> Iterator[Figure]:
    return iter(list(self._figures.values()))

  def __getitem__(self, name: str) -> Figure:
    return self._figures[name]

  def __contains__(self, name: str) -> bool:
    return name in self._figures


def registries() -> tuple[Registry, ...]:
  """Every paper's registry, in the order of `heads_jax.report.figures.PAPERS`."""
  from heads_jax.report import figures  # the paper modules import this module
  return tuple(m.FIGURES for m in figures.paper_modules())


def all_figures() -> dict[str, Figure]:
  """``{name: Figure}`` over every registry (a name registered twice is an error)."""
  out: dict[str, Figure] = {}
  for reg in registries():
    for fig in reg:
      if fig.name in out:
        raise ValueError(f"figure {fig.name!r} is registered by {out[fig.name].paper} and "
                         f"{fig.paper}")
      out[fig.name] = fig
  return out


def section(report: str, title: str) -> Section:
  """The registered `Section` ``title`` of ``report`` (a bare one when none is registered)."""
  for reg in registries():
    for sec in reg.sections():
      if (sec.report, sec.title) == (report, title):
        return sec
  return Section(report, title)


def figure(name: str) -> Figure:
  """The registered figure ``name``."""
  figs = all_figures()
  if name not in figs:
    raise KeyError(f"no figure {name!r} is registered; known: {', '.join(figs)}")
  return figs[name]


def figures_for(report: str, section: str | None = None) -> list[Figure]:
  """The figures of ``report`` (optionally of one ``section``), in registry order."""
  if report not in REPORTS:
    raise ValueError(f"unknown report {report!r}; known: {REPORTS}")
  return [f for f in all_figures().values()
          if report in f.reports and (section is None or f.section == section)]


def draw(report: str, inputs: Inputs | dict, fig_dir, *, dpi: int,
         section: str | None = None, names=None) -> dict[str, Path]:
  """Draws every figure of ``report`` (and ``section``; only ``names`` when given) into
  ``fig_dir/<name>.png``; returns ``{name: png path}`` of those drawn (a draw that returns None
  is left out)."""
  inputs = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
  fig_dir = Path(fig_dir)
  out = {}
  for fig in figures_for(report, section):
    if names is not None and fig.name not in names:
      continue
    path = fig.draw(inputs, fig_dir / f"{fig.name}.png", title=fig.drawn_title(inputs), dpi=dpi)
    if path is not None:
      out[fig.name] = Path(path)
  return out


def figure_texts() -> dict[str, tuple[str, str, str]]:
  """``{name: (title, caption, how)}`` of every registered figure (for `page.figure_spec_html`)."""
  return {name: f.text for name, f in all_figures().items()}


def figures_html(drawn: dict) -> str:
  """The HTML of drawn figures ``{name: png path or {"path", "title", "caption", "how"}}``, each
  with its registered title, caption and how-to-read line (a spec dict may override them)."""
  from heads_jax.report.page import figure_spec_html
  texts = figure_texts()
  return "".join(figure_spec_html(name, sp, texts) for name, sp in drawn.items())


def by_section(report: str, drawn: dict, default: str = "Figures") -> dict[str, dict]:
  """Drawn figures ``{name: path or spec}`` grouped by their registered section of ``report``
  (``{section title: {name: ...}}``, sections in first-figure order; names not registered for
  ``report`` go to ``default``)."""
  figs = {f.name: f for f in figures_for(report)}
  out: dict[str, dict] = {}
  for name, sp in drawn.items():
    out.setdefault(figs[name].section if name in figs else default, {})[name] = sp
  return out


def sections_html(report: str, drawn: dict, default: str = "Figures") -> list[tuple[str, str]]:
  """``[(title, html)]``: one report section per registered section of the drawn figures, each
  its registered paragraph (`Registry.section`) and then its figures."""
  return [(title, section(report, title).intro + figures_html(group))
          for title, group in by_section(report, drawn, default).items()]
