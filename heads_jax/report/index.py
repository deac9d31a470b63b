"""The demo's front page: one self-contained ``report.html`` that links the parts of a run.

Sections: what was run; pre-training and fine-tuning curves; the paper's headline figures side
by side for every analysed model (with links to their full reports); each model's role grid;
the effect of fine-tuning. Host only: reads the files the stages wrote (summary.json through
`heads_jax.contract`), no jax.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from heads_jax import contract, storage
from heads_jax.report import headline, spec
from heads_jax.report.page import esc, figure_html, table_html, write_page

def _link(target: Path, base: Path, text: str) -> str:
  rel = os.path.relpath(Path(target), Path(base))
  return f'<a href="{esc(rel)}">{esc(text)}</a>'


def plot_training_curves(pretrain: dict | None, finetune: dict | None, path) -> Path | None:
  """MLM loss / NSP accuracy of pre-training and dev accuracy of fine-tuning against the step."""
  panels = [p for p in (pretrain, finetune) if p and p.get("train")]
  if not panels:
    return None
  fig = Figure(figsize=(6.2 * len(panels), 3.6))
  axes = fig.subplots(1, len(panels), squeeze=False)
  ax_i = 0
  if pretrain and pretrain.get("train"):
    ax = axes[0, ax_i]
    ax_i += 1
    tr = pd.DataFrame(pretrain["train"])
    if "mlm_loss" in tr:
      ax.plot(tr["step"], tr["mlm_loss"], label="MLM loss (train)", color="#1f4e79")
    if "loss" in tr:
      ax.plot(tr["step"], tr["loss"], label="MLM + NSP loss (train)", color="#7f7f7f", lw=1)
    ev = pd.DataFrame(pretrain.get("eval") or [])
    if len(ev) and "mlm_loss" in ev:
      ax.scatter(ev["step"], ev["mlm_loss"], color="#c00000", zorder=3, label="MLM loss (held out)")
    if len(ev) and "unigram_baseline" in ev:
      ax.axhline(float(ev["unigram_baseline"].iloc[-1]), color="#c00000", ls="--", lw=1,
                 label="unigram baseline (no context)")
    ax.set(title="Pre-training", xlabel="step", ylabel="loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  if finetune and finetune.get("train"):
    ax = axes[0, ax_i]
    tr = pd.DataFrame(finetune["train"])
    if "loss" in tr:
      ax.plot(tr["step"], tr["loss"], label="loss (train)", color="#7f7f7f", lw=1)
    ax.set(title="Fine-tuning on SST-2", xlabel="step", ylabel="loss")
    ev = pd.DataFrame(finetune.get("eval") or [])
    if len(ev) and "accuracy" in ev:
      ax2 = ax.twinx()
      ax2.plot(ev["step"], ev["accuracy"], "o-", color="#2e7d32", label="accuracy (held out)")
      ax2.set_ylim(0, 1)
      ax2.set_ylabel("accuracy")
      ax2.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
  fig.tight_layout()
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with storage.naming(path):  # a full disk names the figure, not a bare [Errno 28]
    fig.savefig(path, dpi=110)
    fig.savefig(path.with_suffix(".svg"))   # every figure also as SVG (README)
  return path


def _training_table(part: dict, metrics: tuple[str, ...]) -> pd.DataFrame | None:
  ev = part.get("eval") or []
  if not ev:
    return None
  rows = [{"step": e.get("step"), **{m: e.get(m) for m in metrics if m in e}} for e in ev]
  return pd.DataFrame(rows)


def write_index(out: Path, parts: dict) -> Path:
  """Writes ``out/report.html`` from the parts of a demo run (see ``heads_jax.pipelines.demo``)."""
  out = Path(out)
  fig_dir = out / "figures"
  sections = []
  analyses = {k: Path(v) for k, v in parts.get("analyses", {}).items()}

  default = ('Quick mode: one model analysed.' if parts.get('quick') else 'The paper’s pipeline: '
             'models analysed with sieve bias scores and hypothesis tests (Pande et al., AAAI 2021) '
             'and distance-feature clustering (Guan et al., COLING 2020).')
  intro = [f"<p>{esc(parts.get('description') or default)}</p>"]
  links = [f"<li>{_link(d / 'report.html', out, f'Full analysis report: {name}')}</li>" for name, d in analyses.items()]
  if parts.get("compare"):
    links.append(f"<li>{_link(Path(parts['compare']) / 'report.html', out, 'Before vs after fine-tuning (compare report)')}</li>")
  intro.append(f"<ul>{''.join(links)}</ul>")
  if parts.get("minutes") is not None:
    took = 60 * float(parts["minutes"])   # the stages' last runs; the folder as the run's own
    took = f"{took:.0f} seconds" if took < 90 else f"{took / 60:.1f} minutes"
    intro.append(f"<p class=\"meta\">Run time: {took} (each stage's last run). Every file "
                 "named here is in this page's folder.</p>")
  sections.append(("What was run", "".join(intro)))
  sections.extend((title, html) for title, html in parts.get("notes") or ())  # the caller's HTML

  if parts.get("pretrain") or parts.get("finetune"):
    body = []
    fig = plot_training_curves(parts.get("pretrain"), parts.get("finetune"), fig_dir / "training.png")
    if fig:
      evals = (parts.get("pretrain") or {}).get("eval") or []
      uni = next((e["unigram_baseline"] for e in reversed(evals) if "unigram_baseline" in e), None)
      uni = f"{uni:.2f}" if uni is not None else "about 6.3"
      body.append(figure_html(
          fig, "Training curves", "Pre-training losses and fine-tuning accuracy on held-out data.",
          f"The MLM loss should fall below the unigram baseline ({uni} nats per wordpiece on the "
          "embedded books: the loss of a model that ignores the context); accuracy is on SST-2 "
          "sentences not used for training.", name="training"))
    pt = _training_table(parts.get("pretrain") or {}, ("mlm_loss", "mlm_accuracy", "nsp_accuracy"))
    if pt is not None:
      body.append("<h3>Pre-training, held-out evaluation</h3>" + table_html(pt))
    ft = _training_table(parts.get("finetune") or {}, ("accuracy", "loss"))
    if ft is not None:
      body.append("<h3>Fine-tuning on SST-2, held-out evaluation</h3>" + table_html(ft))
    sections.append(("Training", "".join(body)))

  if analyses:
    summaries = {name: contract.read_summary(d) if (d / contract.SUMMARY_JSON).is_file() else {}
                 for name, d in analyses.items()}
    rows = headline.headline_table(summaries)
    note = ("<p>Shares are of all heads of a model. A role is assigned to a head when its mean sieve "
            "bias over the sequences is significantly above tau = 3 (one-sided t-test, alpha = 0.05) "
            "and, under the calibrated rule (the default, named on every role figure), also "
            "significantly above what uniform attention scores on the same sequences (1; ln n for "
            "block); heads whose attention is near-uniform get no role (DESIGN.md section 3). "
            "Data: UD EWT test sentences (gold parses, for the syntactic roles) and MRPC sentence "
            "pairs (for the block role).</p>")
    sections.append(("Headline findings", note + table_html(rows)))
    # the analyses' and the comparison's registered figures (`heads_jax.report.spec`), as drawn
    grid = spec.figure("role_grid")
    grids = [figure_html(d / "figures" / f"{grid.name}.png", f"{grid.title}: {name}", grid.caption,
                         grid.how, name=f"grid-{name}")
             for name, d in analyses.items() if (d / "figures" / f"{grid.name}.png").is_file()]
    if grids:
      sections.append(("Roles per head", "".join(grids)))
  if parts.get("compare"):
    delta = spec.figure("finetune_delta")
    f = Path(parts["compare"]) / "figures" / f"{delta.name}.png"
    if f.is_file():
      sections.append(("Effect of fine-tuning", figure_html(f, delta.title, delta.caption,
                                                            delta.how, name="delta")))
  title = "heads_jax demo" + (" (quick)" if parts.get("quick") else "")
  return write_page(out, title=title, subtitle="BERT attention heads: what each head does",
                    sections=sections)
