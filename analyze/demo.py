"""Run the paper's pipeline in miniature on the embedded data: pre-train, fine-tune, analyse, compare, report.

Everything is offline and fits a 2-core laptop CPU in about 20 minutes (--quick: about a
minute, analysis only). Re-running reuses what is already done (checkpoints, analyses). Thin
entry point over ``heads_jax.demo.run_demo``.
"""

from heads_jax.demo import run_demo


def add_args(p):
  p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
  p.add_argument("--quick", action="store_true", help="analysis of one existing or small model only (about a minute)")
  p.add_argument("--redo", action="store_true", help="recompute every stage instead of reusing earlier results")
  p.add_argument("--pretrain-steps", type=int, default=700, help="pre-training steps (default 700)")
  p.add_argument("--finetune-steps", type=int, default=200, help="fine-tuning steps (default 200)")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def main(args):
  run_demo(args.out, quick=args.quick, redo=args.redo, pretrain_steps=args.pretrain_steps,
           finetune_steps=args.finetune_steps)
