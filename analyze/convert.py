"""Convert a Hugging Face model directory (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA,
ALBERT; or a hub id in the local cache) into a heads_jax model directory, or back.

The direction follows the source: a directory with ``heads_jax.json`` is exported to Hugging
Face format (``config.json`` + ``model.safetensors`` + tokenizer); a Hugging Face directory is
imported into heads_jax format. Heads (BERT's MLM/NSP, the family's sequence classifier) are
kept; other heads (e.g. RoBERTa's lm_head) are dropped. Thin entry point over
``heads_jax.model.loading.convert_dir``.
"""

from __future__ import annotations


def add_args(p):
  p.add_argument("src", help="a Hugging Face model directory (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, "
                             "ELECTRA, ALBERT), a hub id in the local HF cache, or a heads_jax model directory")
  p.add_argument("dst", help="output directory (must not hold another model)")
  p.add_argument("--overwrite", action="store_true", help="replace the files of an existing output directory")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  from heads_jax.model.loading import convert_dir
  kind, model = convert_dir(args.src, args.dst, overwrite=args.overwrite)
  print(f"wrote {kind} {type(model).__name__} ({model.config.num_layers} layers x "
        f"{model.config.num_heads} heads) to {args.dst}")
