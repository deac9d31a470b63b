"""Ablate attention heads of a fine-tuned classifier: groups, intra/inter attention, importance, pruning.

Evaluates the classifier on its GLUE dev set with groups of heads removed (gate 0) or replaced
by uniform attention (--by cluster|role|layer|heads; Guan et al. 2020 Table 2), with the
intra- or inter-sentence attention of chosen heads removed (--cross; Guan et al. Table 3), and
computes head importance and the pruning curve (--importance, --prune; Michel et al. 2019).
Each ablation is compared with random groups of the same size. Writes into --out: ablation.csv,
segment_ablation.csv, importance.csv, pruning.csv, pruning_summary.csv, ablation.json,
figures/*.png and report.html.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from heads_jax.errors import UserError


def add_args(p):
  p.add_argument("--model", required=True, help="fine-tuned classifier: a heads_jax model directory "
                 "(e.g. a fine-tuning run's best_model) or a Hugging Face BertForSequenceClassification")
  p.add_argument("--data", required=True, metavar="SPEC",
                 help="labelled GLUE data: glue-tsv:DIR/TASK[:SPLIT] | glue:TASK[:SPLIT] (TFDS) | sst2 | mrpc")
  p.add_argument("--task", default=None, help="GLUE task (default: the data's)")
  p.add_argument("--finetune-data", default=None, metavar="PATH",
                 help="a fine-tuning run's data.json (or work directory): evaluate only on the rows "
                      "it held out for evaluation (when it trained on part of the same split)")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--analysis", default=None, metavar="DIR",
                 help="output directory of `heads-jax analyze` on this model (clusters.csv, tests.csv)")
  p.add_argument("--by", choices=("cluster", "role", "layer", "heads"), default=None,
                 help="ablate groups of heads: by cluster type, assigned role, layer, or --heads")
  p.add_argument("--role-level", choices=("coarse", "fine"), default="coarse",
                 help="--by role: coarse roles + unskilled (default) or every fine role")
  p.add_argument("--mode", choices=("remove", "uniform"), default="remove",
                 help="remove: gate 0 (default); uniform: attention replaced by uniform over real tokens")
  p.add_argument("--heads", default=None, metavar="L:H,...",
                 help="heads for --by heads or --cross: 'L:H,L:H' (L:* = a whole layer); several "
                      "groups separated by ';', each optionally NAME=L:H,...")
  p.add_argument("--cross", choices=("intra", "inter", "both"), default=None,
                 help="remove the intra- or inter-sentence attention of the --cluster heads (or --heads)")
  p.add_argument("--cluster", action="append", default=None, metavar="TYPE",
                 help="cluster type(s) for --cross (repeat; default: every type in --analysis)")
  p.add_argument("--renormalise", action="store_true",
                 help="--cross: renormalise attention rows after the removal (default: not, as the paper)")
  p.add_argument("--importance", action="store_true", help="compute head importance (Michel et al.)")
  p.add_argument("--prune", action="store_true", help="pruning curve by importance vs random (implies --importance)")
  p.add_argument("--prune-step", type=float, default=0.1, help="share of heads pruned per step (default 0.1; e.g. 0.05)")
  p.add_argument("--prune-max", type=float, default=1.0, help="largest share pruned (default 1.0)")
  p.add_argument("--prune-once", action="store_true",
                 help="order heads by the full model's importance once (default: re-estimate after each step, as Michel et al.)")
  p.add_argument("--importance-per-batch", action="store_true",
                 help="|gradient of each batch's mean loss| (the authors' code) instead of per-example |gradients|")
  p.add_argument("--no-layer-norm", dest="layer_norm", action="store_false",
                 help="do not divide each layer's importance by its L2 norm (default: divide, as Michel et al.'s code)")
  p.add_argument("--importance-data", default=None, metavar="SPEC",
                 help="estimate importance on other labelled data (default: the --data set)")
  p.add_argument("--random-seeds", type=int, default=3, help="random groups / orders per comparison (default 3)")
  p.add_argument("--seed", type=int, default=0, help="first random seed (default 0)")
  p.add_argument("--max-examples", type=int, default=None, help="first N examples of the data")
  p.add_argument("--max-length", type=int, default=128, help="wordpieces per example (default 128)")
  p.add_argument("--batch-size", type=int, default=64, help="examples per device step (default 64)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="compute dtype override")
  p.add_argument("--title", default=None, help="report title")
  p.add_argument("--debug", action="store_true", help="show tracebacks")


def _print_table(df, columns, log):
  cols = [c for c in columns if c in df.columns]
  log(df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))


def run_ablation(args, log=print) -> dict:
  """Runs what ``args`` asks for; returns the paths and results."""
  import numpy as np
  import pandas as pd
  from heads_jax.ablation import ablate, evaluate, groups as groups_lib, importance as imp_lib, pruning
  from heads_jax.report import ablation as rep
  from heads_jax.report.html import table_html

  if not (args.by or args.cross or args.importance or args.prune):
    raise UserError("nothing to do: ask for --by cluster|role|layer|heads, --cross intra|inter|both, "
                    "--importance and/or --prune")
  out = Path(args.out)
  if out.exists() and not out.is_dir():
    raise UserError(f"--out {out} is a file; give a directory")
  out.mkdir(parents=True, exist_ok=True)
  fig_dir = out / "figures"
  t0 = time.time()
  model, tokenizer = evaluate.load_classifier(args.model, dtype=args.dtype)
  rows = evaluate.eval_rows_from_finetune(args.finetune_data) if args.finetune_data else None
  data = evaluate.load_eval_data(args.data, tokenizer, task=args.task, max_length=args.max_length,
                                 max_examples=args.max_examples, rows=rows)
  ev = evaluate.Evaluator(model, data, batch_size=args.batch_size)
  L, H = ev.num_layers, ev.num_heads
  base = ev.evaluate()
  metrics = data.metric_names
  log(f"{data.task.name}: {len(data)} examples ({data.name}); {L} layers x {H} heads; unablated "
      + ", ".join(f"{m} {base[m]:.4f}" for m in metrics))
  settings = {"model": str(args.model), "data": args.data, "task": data.task.name,
              "evaluation set": data.name, "examples": len(data), "layers": L, "heads": H,
              "metrics": ", ".join(metrics), "random seeds": args.random_seeds, "seed": args.seed,
              "max length": args.max_length}
  results = {"settings": settings, "baseline": base, "files": {}}
  sections = [{"title": "Unablated model", "html": table_html(
      pd.DataFrame([{k: base[k] for k in ("accuracy", "f1", "loss", "n")}]),
      table_id="table-baseline", float_format="{:.4f}")}]
  show = ["group", "num_heads", "ablation"] + [c for m in metrics for c in (m, f"{m}_change",
                                                                          f"random_{m}_change")]

  if args.by:
    groups = groups_lib.load_groups(args.by, num_layers=L, num_heads=H, analysis=args.analysis,
                                    heads=args.heads, role_level=args.role_level)
    table = ablate.ablate_groups(ev, groups, mode=args.mode, random_seeds=args.random_seeds,
                                 seed=args.seed, base=base, log=log)
    table.to_csv(out / "ablation.csv", index=False)
    fig = rep.plot_group_ablation(table, fig_dir / "ablation.png")
    note = (f"Heads {'removed (gate 0)' if args.mode == 'remove' else 'given uniform attention over the real tokens'}; "
            f"groups by {args.by}" + (f" from {args.analysis}" if args.analysis else "") + ".")
    sections.append(rep.ablation_section(table, fig, title=f"Ablation by {args.by}", note=note))
    settings.update({"grouping": args.by, "ablation mode": args.mode})
    results["files"]["ablation"] = str(out / "ablation.csv")
    results["ablation"] = table.to_dict(orient="records")
    log(f"\nablation by {args.by} ({args.mode}):")
    _print_table(table, show, log)

  if args.cross:
    if args.cluster or (args.analysis and not args.heads):
      cgroups = groups_lib.load_groups("cluster", num_layers=L, num_heads=H, analysis=args.analysis)
      if args.cluster:
        known = [g.name for g in cgroups]
        bad = [c for c in args.cluster if c not in known]
        if bad:
          raise UserError(f"--cluster {bad} not in {args.analysis}/clusters.csv (types: {known})")
        cgroups = [g for g in cgroups if g.name in args.cluster]
    elif args.heads:
      cgroups = groups_lib.load_groups("heads", num_layers=L, num_heads=H, heads=args.heads)
    else:
      raise UserError("--cross needs the heads: --analysis DIR [--cluster TYPE] or --heads L:H,...")
    parts = ("intra", "inter") if args.cross == "both" else (args.cross,)
    if not data.task.is_pair:
      log(f"note: {data.task.name} has single sentences: all attention is intra-sentence, so "
          "removing it removes the heads' whole attention" + (", and inter removal changes nothing"
                                                              if "inter" in parts else ""))
    table = ablate.ablate_segments(ev, cgroups, parts=parts, renormalise=args.renormalise,
                                   random_seeds=args.random_seeds, seed=args.seed, base=base, log=log)
    table.to_csv(out / "segment_ablation.csv", index=False)
    fig = rep.plot_segment_ablation(table, fig_dir / "segment_ablation.png")
    sections.append(rep.segment_section(table, fig))
    settings["intra/inter rows renormalised"] = bool(args.renormalise)
    results["files"]["segment_ablation"] = str(out / "segment_ablation.csv")
    results["segment_ablation"] = table.to_dict(orient="records")
    log(f"\nintra/inter-sentence attention removed ("
        f"{'rows renormalised' if args.renormalise else 'rows not renormalised, as Guan et al.'}):")
    _print_table(table, show, log)

  if args.importance or args.prune:
    src = ev
    if args.importance_data:
      idata = evaluate.load_eval_data(args.importance_data, tokenizer, task=data.task.name,
                                      max_length=args.max_length, max_examples=args.max_examples)
      src = evaluate.Evaluator(model, idata, batch_size=args.batch_size, mesh=ev.mesh)
    est = imp_lib.ImportanceEstimator(src, per_example=not args.importance_per_batch,
                                      normalize_layers=args.layer_norm)
    raw = est.raw()
    imp = imp_lib.normalize_by_layer(raw) if args.layer_norm else raw
    table = rep.importance_table(imp, raw)
    table.to_csv(out / "importance.csv", index=False)
    np.save(out / "importance.npy", imp)
    imp_settings = {"gradient": "per example" if not args.importance_per_batch else "per batch (authors' code)",
                    "layer L2 normalisation": bool(args.layer_norm),
                    "estimated on": (src.data.name if src is not ev else data.name)}
    fig = rep.plot_importance(imp, fig_dir / "importance.png",
                              label="importance (layer-normalised)" if args.layer_norm else "E|dL/dgate|")
    sections.append(rep.importance_section(imp, fig, raw=raw, settings=imp_settings))
    results["files"]["importance"] = str(out / "importance.csv")
    results["importance"] = {"settings": imp_settings, "values": imp.tolist()}
    top = table.sort_values("rank").head(5)
    log("\nmost important heads: " + ", ".join(f"{l}:{h} ({v:.3g})" for l, h, v in
                                                zip(top["layer"], top["head"], top["importance"])))
    if args.prune:
      curve = pruning.pruning_curve(ev, est, step=args.prune_step, max_share=args.prune_max,
                                    reestimate=not args.prune_once, random_seeds=args.random_seeds,
                                    seed=args.seed, log=log)
      summary = pruning.curve_summary(curve, metrics)
      curve.to_csv(out / "pruning.csv", index=False)
      summary.to_csv(out / "pruning_summary.csv", index=False)
      fig = rep.plot_pruning_curve(curve, fig_dir / "pruning.png")
      prune_settings = {"step": args.prune_step, "largest share": args.prune_max,
                        "importance re-estimated after each step": not args.prune_once,
                        "random orders": args.random_seeds}
      sections.append(rep.pruning_section(curve, summary, fig, settings=prune_settings))
      results["files"]["pruning"] = str(out / "pruning.csv")
      results["pruning"] = summary.to_dict(orient="records")
      log("\npruning curve:")
      log(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))

  settings["seconds"] = round(time.time() - t0, 1)
  title = args.title or f"Head ablation: {Path(str(args.model)).name} on {data.task.name}"
  report = rep.write_page(out, title=title, sections=sections, settings=settings,
                          subtitle=f"model: {args.model} | data: {data.name}")
  results["report"] = str(report)
  (out / "ablation.json").write_text(json.dumps(results, indent=2, default=str))
  log(f"\nreport: {report}")
  return results


def main(args):
  run_ablation(args)
