"""Figures of Clark et al. 2019 ("What does BERT look at?") from ``measures.npz``: attention
entropy per head (Fig. 4), attention to [CLS], [SEP], punctuation and the neighbouring tokens
(Figs. 1-2), and the heads embedded by their Jensen-Shannon distances (Fig. 6, metric MDS).
No jax.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
from sklearn.manifold import MDS

from heads_jax.report.figures.common import DEFAULT_DPI, new_figure, save_figure
from heads_jax.report.spec import Registry

TOKEN_MEASURE_LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation (, .)",
                        "prev": "previous token", "next": "next token"}


# The registry of this paper's figures (`heads_jax.report.spec`); registered at the end.
FIGURES = Registry('Clark et al. 2019')


def _per_layer_scatter(ax, values, *, ylabel: str, reference=None, color="#2c7fb8"):
  """Scatter of each head's value by layer (jittered), the layer mean as a line."""
  values = np.asarray(values, float)
  L, H = values.shape
  rng = np.random.default_rng(0)
  for l in range(L):
    ax.scatter(l + rng.uniform(-0.18, 0.18, H), values[l], s=14, color=color, alpha=0.7,
               edgecolor="none")
  ax.plot(np.arange(L), np.nanmean(values, axis=1), "-", color="black", linewidth=1, label="layer mean")
  if reference is not None:
    ax.axhline(reference, color="#b2182b", linestyle=":", linewidth=1, label="uniform attention")
  ax.set_xticks(np.arange(L))
  ax.set_xlabel("layer")
  ax.set_ylabel(ylabel)
  ax.grid(True, alpha=0.3)


def plot_token_attention(token_attention, path, *, names=tuple(TOKEN_MEASURE_LABELS),
                         title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """One panel per measure (``[CLS]``, ``[SEP]``, punctuation, previous, next token): the mean
  attention of each head by layer (Clark et al. 2019, Figs. 1-2). ``token_attention``:
  ``[l, h, 5]`` (already averaged over sequences)."""
  ta = np.asarray(token_attention, float)
  if ta.ndim != 3 or ta.shape[-1] != len(names):
    raise ValueError(f"token_attention must be [layers, heads, {len(names)}], got {ta.shape}")
  fig = new_figure(3.1 * len(names), 3.4)
  axes = fig.subplots(1, len(names), sharey=True)
  for i, (ax, name) in enumerate(zip(np.atleast_1d(axes), names)):
    _per_layer_scatter(ax, ta[..., i], ylabel="mean attention" if i == 0 else "")
    ax.set_title(TOKEN_MEASURE_LABELS.get(name, name), fontsize=10)
  fig.suptitle(title or "Where heads attend (Clark et al. 2019)")
  return save_figure(fig, path, dpi)


def plot_entropy(entropy, cls_entropy, path, *, mean_length: float | None = None,
                 title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """Per-layer scatter of each head's mean attention entropy and of its ``[CLS]`` row's entropy
  (Clark et al. 2019, Fig. 4); the entropy of uniform attention over the mean length is marked."""
  fig = new_figure(9.0, 3.6)
  a, b = fig.subplots(1, 2, sharey=True)
  ref = None if not mean_length else float(np.log(mean_length))
  _per_layer_scatter(a, entropy, ylabel="entropy (nats)", reference=ref)
  a.set_title("mean over all queries", fontsize=10)
  _per_layer_scatter(b, cls_entropy, ylabel="", reference=ref, color="#d95f02")
  b.set_title("[CLS] query", fontsize=10)
  a.legend(fontsize=8, loc="best")
  fig.suptitle(title or "Attention entropy per head")
  return save_figure(fig, path, dpi)


def mds_embedding(distances, seed: int = 0) -> np.ndarray:
  """2-D metric MDS of a precomputed, symmetric distance matrix ``[n, n]`` -> ``[n, 2]``."""
  d = np.asarray(distances, np.float64)
  if d.ndim != 2 or d.shape[0] != d.shape[1]:
    raise ValueError(f"distances must be a square matrix, got shape {d.shape}")
  d = (d + d.T) / 2
  np.fill_diagonal(d, 0.0)
  params = inspect.signature(MDS).parameters
  kw = {"n_components": 2, "random_state": seed, "n_init": 4}
  if "metric_mds" in params:            # scikit-learn >= 1.8
    kw.update(metric="precomputed", metric_mds=True)
  else:
    kw.update(dissimilarity="precomputed")
  if "init" in params and "n_init" in params:
    kw["init"] = "random"
  if "normalized_stress" in params:
    kw["normalized_stress"] = "auto"
  return MDS(**kw).fit_transform(d)


def plot_js_mds(js, num_layers: int, num_heads: int, path, *, seed: int = 0,
                title: str | None = None, dpi: int = DEFAULT_DPI) -> Path:
  """2-D MDS of the heads from their mean Jensen-Shannon distances, coloured by layer and
  labelled ``layer-head`` (Clark et al. 2019, Fig. 6)."""
  js = np.asarray(js, float)
  if js.shape != (num_layers * num_heads,) * 2:
    raise ValueError(f"js must be [{num_layers * num_heads}, {num_layers * num_heads}], got {js.shape}")
  xy = mds_embedding(js, seed)
  fig = new_figure(7.2, 6.0)
  ax = fig.add_subplot()
  layers = np.repeat(np.arange(num_layers), num_heads)
  sc = ax.scatter(xy[:, 0], xy[:, 1], c=layers, cmap="viridis", s=46, edgecolor="white",
                  linewidths=0.4)
  if num_layers * num_heads <= 200:
    for i, (x, y) in enumerate(xy):
      ax.text(x, y, f"{i // num_heads}-{i % num_heads}", fontsize=5.5, ha="center",
              va="bottom", color="#333333")
  cb = fig.colorbar(sc, ax=ax)
  cb.set_label("layer")
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title(title or "Heads embedded by Jensen-Shannon distance (MDS)")
  return save_figure(fig, path, dpi)


# ---------------------------------------------------------------------------------------------
# the registry: how each report draws these figures from its inputs (`heads_jax.report.spec`);
# the drawn title is the plot's own, the report's heading the spec's title


def _draw_entropy(i, path, *, title, dpi):
  """Inputs: ``entropy`` and ``cls_entropy`` ``[l, h]`` (means over the sequences), ``mean_length``."""
  return plot_entropy(i.entropy, i.cls_entropy, path, mean_length=i.mean_length, dpi=dpi)


def _draw_tokens(i, path, *, title, dpi):
  """Inputs: ``token_attention`` ``[l, h, m]`` (mean over the sequences), ``token_names``."""
  return plot_token_attention(i.token_attention, path, names=i.token_names, dpi=dpi)


def _draw_js_mds(i, path, *, title, dpi):
  """Inputs: ``js`` ``[l*h, l*h]``, ``num_layers``, ``num_heads``."""
  if i.js is None or not np.asarray(i.js).size:
    return None
  return plot_js_mds(i.js, i.num_layers, i.num_heads, path, dpi=dpi)


# the measures report's sections (`Figure.section`), each with the paragraph above its figure
FIGURES.section("measures", "Attention entropy (Clark et al. 2019)", (
    "<p>The entropy (natural log) of each head's attention rows over the real tokens, averaged "
    "over the queries and the sequences; and the entropy of the [CLS] query's row alone. Low "
    "entropy: focused attention; the dotted line is uniform attention over a sequence of mean "
    "length.</p>"))
FIGURES.section("measures", "Attention to special tokens and neighbours", (
    "<p>Mean attention mass each head puts on [CLS], on [SEP], on commas and periods, and on the "
    "previous and the next token (Clark et al. 2019, Figs. 1-2), averaged over the real queries "
    "(for previous / next: those that have one) and the sequences.</p>"))
FIGURES.section("measures", "Heads by Jensen-Shannon distance", (
    "<p>The mean Jensen-Shannon distance between the attention rows of every pair of heads "
    "(averaged over the real queries and the sequences), embedded in two dimensions by "
    "multidimensional scaling (Clark et al. 2019, Fig. 6).</p>"))

# name, title, caption (what is drawn), how (how to read it), how each report draws it
FIGURES.register_all({
    'measures_entropy': {
        "title": 'Attention entropy per head',
        "caption": 'Each dot is one head; the line is the layer mean.',
        "how": ('Heads near the dotted line attend broadly (a bag of words); heads near 0 '
                'attend to one token.'),
        "draw": _draw_entropy,
        "needs": ("entropy",),
        "reports": ("measures",),
        "section": "Attention entropy (Clark et al. 2019)",
        "reproduces": "Fig. 4",
    },
    'measures_tokens': {
        "title": 'Where heads attend',
        "caption": 'One panel per target; each dot is one head.',
        "how": ("Middle layers attending heavily to [SEP] is the 'no-op' pattern Clark et "
                'al. describe; heads near 1 on previous / next are positional heads.'),
        "draw": _draw_tokens,
        "needs": ("token_attention",),
        "reports": ("measures",),
        "section": "Attention to special tokens and neighbours",
        "reproduces": "Figs. 1-2",
    },
    'measures_js_mds': {
        "title": 'Heads embedded by Jensen-Shannon distance',
        "caption": 'Each dot is one head, coloured by layer and labelled layer-head.',
        "how": ('Heads close together attend alike; Clark et al. find heads of the same '
                'layer tend to cluster.'),
        "draw": _draw_js_mds,
        "reports": ("measures",),
        "section": "Heads by Jensen-Shannon distance",
        "reproduces": "Fig. 6",
    },
})
