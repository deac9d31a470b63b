"""One long document with the default settings (issue 50 item 5): the peak memory of
``heads-jax analyze --max-length 8192 --no-robustness`` on one 8,000-token line.

Writes a 2-layer, 8-head BERT (hidden 128, 8,192 positions, random weights, the embedded
vocabulary) with the project's own ``save_model``, and one line of 8,000 wordpieces with
[CLS] and [SEP] (common words, so every token is one wordpiece), then runs the command as a user
would (default ``--batch-size``: the token budget gives one row of 8,192; ``auto`` takes the
map-free statistics kernel because one layer's maps, 2.1 GB, do not fit
``stats.step.LAYER_MAP_BYTES``) in a child process and reports its peak resident memory
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, what ``/usr/bin/time -v`` prints as
"Maximum resident set size"). The goal is at most 2.5 GB; before the token budget the command
refused ("out of memory; try a smaller --batch-size"), and with ``--batch-size 1`` it peaked at
21.7 GB on the per-layer path.

    python bench/bench_long_document.py [--tokens 8000] [--work DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the cat sat on a mat , and the dog ran to the park . it was a sunny day in the "
         "city").split()


def write_inputs(work: Path, tokens: int) -> tuple[Path, Path]:
  """The tiny model directory and the one-line text file (``tokens`` wordpieces with
  [CLS]/[SEP])."""
  from flax import nnx

  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.checkpoint import save_model
  from heads_jax.model.config import config_for
  tok = load_tokenizer()
  cfg = config_for("tiny", num_heads=8, hidden_size=128, intermediate_size=256,
                   max_position_embeddings=8192)
  model = save_model(BertModel(cfg, rngs=nnx.Rngs(0)), work / "model", tok)
  rng = random.Random(0)
  line = " ".join(rng.choice(WORDS) for _ in range(tokens - 2))
  got = len(tok(line)["input_ids"])
  if got != tokens:
    raise SystemExit(f"the line has {got} wordpieces, not {tokens}")
  text = work / "one_line.txt"
  text.write_text(line + "\n")
  return model, text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tokens", type=int, default=8000)
  p.add_argument("--max-length", type=int, default=8192)
  p.add_argument("--work", help="folder for the model, the text and the output (default: temp)")
  p.add_argument("--json", help="write the figures here")
  args = p.parse_args(argv)
  work = Path(args.work or tempfile.mkdtemp(prefix="long_document_"))
  work.mkdir(parents=True, exist_ok=True)
  model, text = write_inputs(work, args.tokens)
  cmd = ["heads-jax", "analyze", "--model", str(model), "--data", f"text:{text}",
         "--out", str(work / "out"), "--max-length", str(args.max_length), "--no-robustness",
         "--overwrite"]
  start = time.time()
  done = subprocess.run(cmd, capture_output=True, text=True)
  peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  out = {"command": " ".join(cmd[:1] + cmd[1:]), "tokens": args.tokens,
         "exit_status": done.returncode, "peak_rss_gb": round(peak_kb * 1024 / 1e9, 3),
         "wall_s": round(time.time() - start, 1)}
  print(json.dumps(out, indent=1))
  if done.returncode:
    print(done.stderr[-2000:], file=sys.stderr)
  if args.json:
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
  return done.returncode


if __name__ == "__main__":
  sys.exit(main())
