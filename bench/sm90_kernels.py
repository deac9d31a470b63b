"""The statistics kernel of BERT-base shapes (12 heads of 64) compiled offline for sm_90
(`heads_jax.stats.sm90`: the pip ``triton`` wheel's pipeline and its ``ptxas -v``, no GPU): one
line per kernel with registers, spills, shared memory and its asynchronous copies.

    python bench/sm90_kernels.py [--batch 4 --length 128 --num-warps 8 --ptx DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

from heads_jax.stats import sm90


def main(argv=None) -> int:
  """Compile the statistics kernel of BERT-base shapes (12 heads of 64) offline for sm_90."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--num-warps", type=int, default=None)
  p.add_argument("--num-stages", type=int, default=None)
  p.add_argument("--ptx", help="write each kernel's PTX to this folder")
  args = p.parse_args(argv)
  try:
    sm90._require_triton()
  except RuntimeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  from heads_jax.stats import kernel
  fn, shapes = kernel.triton_program(args.batch, args.length, args.heads, args.head_dim,
                                     args.dtype)
  for call in sm90.triton_calls(sm90.export_text(fn, *shapes)):
    report = sm90.compile_call(call, num_warps=args.num_warps, num_stages=args.num_stages)
    print(report.line())
    if args.ptx:
      os.makedirs(args.ptx, exist_ok=True)
      with open(os.path.join(args.ptx, f"{report.name}.ptx"), "w") as f:
        f.write(report.ptx)
  return 0


if __name__ == "__main__":
  sys.exit(main())
