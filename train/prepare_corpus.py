"""Prepare the pre-training corpus once: English Wikipedia (Parquet) + folders of books -> shards and a byte-offset index.

  heads-jax prepare-corpus --out corpus/paper \\
      --wikipedia wikipedia/20231101.en --text ../shared/data/corpus/gutenberg
  heads-jax pretrain --config configs/pretrain.py:bert_base --workdir gs://BUCKET/pt1 \\
      --config.data.sources=corpus/paper

--out may be a gs:// URL. Running the same command again resumes (inputs already done are
skipped). Thin entry point over ``heads_jax.data.prepare.prepare_corpus``.
"""

from __future__ import annotations

import sys



def add_args(p):
  p.add_argument("--out", required=True, help="output directory (a local path or gs://...)")
  p.add_argument("--wikipedia", action="append", default=[], metavar="PARQUET",
                 help="Wikipedia Parquet files with id/text columns (Hugging Face wikimedia/wikipedia), a "
                      "folder of them or a glob; repeatable")
  p.add_argument("--text", action="append", default=[], metavar="PATH",
                 help="text files, a folder of *.txt files or a glob (e.g. the Gutenberg books); repeatable")
  p.add_argument("--text-layout", choices=("paragraphs", "lines"), default="paragraphs",
                 help="paragraphs: a book per file, blank lines between paragraphs (default); lines: one "
                      "paragraph per line, blank lines between documents")
  p.add_argument("--heldout-fraction", type=float, default=None,
                 help="share of documents held out for evaluation, never trained on (default 0.005: "
                      "heads_jax.data.prepare.DEFAULT_HELDOUT)")
  p.add_argument("--part-bytes", type=int, default=None,
                 help="books are cut at blank lines into documents of about this many bytes (default "
                      "65536: heads_jax.data.corpora.PART_BYTES)")
  p.add_argument("--text-key", default="text", help="the Parquet column holding an article's text (default text)")
  p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  from heads_jax.data.corpora import PART_BYTES
  from heads_jax.data.prepare import DEFAULT_HELDOUT, prepare_corpus
  heldout = DEFAULT_HELDOUT if args.heldout_fraction is None else args.heldout_fraction
  part_bytes = PART_BYTES if args.part_bytes is None else args.part_bytes
  manifest = prepare_corpus(args.out, wikipedia=args.wikipedia, text=args.text,
                            text_layout=args.text_layout, heldout_fraction=heldout,
                            part_bytes=part_bytes, text_key=args.text_key, progress=args.progress)
  s = manifest["splits"]
  print(f"done: {s['train']['documents']:,} training documents ({s['train']['bytes'] / 1e6:,.1f} MB), "
        f"{s['eval']['documents']:,} held out ({s['eval']['bytes'] / 1e6:,.1f} MB) in {args.out}")
  return 0


if __name__ == "__main__":
  from heads_jax import cli
  sys.exit(cli.main(["prepare-corpus", *sys.argv[1:]]))
