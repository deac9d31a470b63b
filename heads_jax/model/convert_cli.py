"""Convert a Hugging Face BERT directory into a heads_jax model directory, or back.

The direction follows the source: a directory with ``heads_jax.json`` is exported to Hugging
Face format (``config.json`` + ``model.safetensors`` + tokenizer); a Hugging Face directory is
imported into heads_jax format. Heads (MLM/NSP, classifier) are kept.
"""

from __future__ import annotations

from pathlib import Path


def add_args(p):
  p.add_argument("src", help="a Hugging Face BERT directory or a heads_jax model directory")
  p.add_argument("dst", help="output directory (must not hold another model)")
  p.add_argument("--overwrite", action="store_true", help="replace the files of an existing output directory")


def main(args):
  from heads_jax.model.checkpoint import is_heads_jax_dir, save_model
  from heads_jax.model.convert import export_hf
  from heads_jax.model.loading import load_model
  src, dst = Path(args.src), Path(args.dst)
  if dst.exists() and any(dst.iterdir()) and not args.overwrite:
    raise FileExistsError(f"{dst} is not empty; choose a new directory or pass --overwrite")
  model, tokenizer = load_model(src, head="auto")
  if is_heads_jax_dir(src):
    export_hf(model, tokenizer, dst)
    kind = "Hugging Face"
  else:
    save_model(model, dst, tokenizer)
    kind = "heads_jax"
  print(f"wrote {kind} {type(model).__name__} ({model.config.num_layers} layers x "
        f"{model.config.num_heads} heads) to {dst}")
