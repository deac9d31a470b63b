"""Ablate attention heads of a fine-tuned classifier: groups, intra/inter attention, importance, pruning.

Evaluates the classifier on its GLUE dev set with groups of heads removed (gate 0) or replaced
by uniform attention (--by cluster|role|layer|heads; Guan et al. 2020 Table 2), with the
intra- or inter-sentence attention of chosen heads removed (--cross; Guan et al. Table 3), and
computes head importance and the pruning curve (--importance, --prune; Michel et al. 2019).
Each ablation is compared with random groups of the same layers (none for a group of whole
layers). Writes into --out: ablation.csv, segment_ablation.csv, importance.csv, pruning.csv,
pruning_summary.csv, ablation.json, figures/*.png and report.html.

On the stage engine (`heads_jax.pipelines.engine`), with the stage kinds of
`heads_jax.pipelines.ablation`: the unablated ``baseline``, then one stage per sub-job asked
for (`SUB_JOBS`), then the ``report``; each is keyed by the content of what it
reads (the model's files, the data's, the analysis files its groups come from) and its own
settings, so a rerun with the same inputs reuses every part, a changed input or setting reruns
the parts that read it, and ``redo=STAGE`` (``--redo``) reruns one and what reads it. The run
directory is locked while the job runs and says what it is (`runfiles.claim_dir`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heads_jax import contract, runfiles
from heads_jax.ablation import evaluate
from heads_jax.ablation.attribution import OBJECTIVES
from heads_jax.ablation.corrupt import CORRUPTIONS
from heads_jax.ablation.tasks import check_classifier_task, task_name
from heads_jax.data import glue
from heads_jax.data.specs import parse_spec
from heads_jax.errors import UserError
from heads_jax.pipelines import engine
from heads_jax.pipelines.ablation import (REPORT, SUB_JOBS, AblationConfig,  # noqa: F401 (the job's)
                                          ablation_job, ablation_stages)
from heads_jax.pipelines.comparison import same_model


def check_config(config: AblationConfig) -> None:
  """Refuses (UserError, one line naming the flag) a count or an option that is out of range or
  would be ignored, before anything is loaded or written."""
  if not (config.by or config.cross or config.importance or config.prune or config.paper_tables
          or config.attribution or config.patching):
    raise UserError("nothing to do: ask for --by cluster|role|layer|heads, --cross intra|inter|both, "
                    "--importance, --prune, --attribution and/or --patching")
  counts = {"--random-groups": (config.random_groups, 0), "--random-seeds": (config.random_seeds, 0),
            "--seed": (config.seed, 0), "--max-examples": (config.max_examples, 1),
            "--max-length": (config.max_length, 8), "--doc-stride": (config.doc_stride, 1),
            "--batch-size": (config.batch_size, 1)}
  counts.update({"--steps": (config.steps, 1), "--maps": (config.maps, 0),
                 "--attribution-examples": (config.attribution_examples, 1)})
  for flag, (value, least) in counts.items():
    if value is None and flag in ("--max-examples", "--attribution-examples"):
      continue
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
      raise UserError(f"{flag} {value}: give a whole number of at least {least}"
                      + (" (0: no causal test)" if flag == "--random-groups" else "")
                      + (" (the integral's Riemann steps; the paper's m = 20)" if flag == "--steps"
                         else ""))
  if config.objective not in OBJECTIVES:
    raise UserError(f"--objective {config.objective}: choose one of {', '.join(OBJECTIVES)}")
  if config.corrupt is not None and config.corrupt not in CORRUPTIONS:
    raise UserError(f"--corrupt {config.corrupt}: choose one of {', '.join(CORRUPTIONS)}")
  if not (isinstance(config.corrupt_share, (int, float)) and 0 < config.corrupt_share <= 1):
    raise UserError(f"--corrupt-share {config.corrupt_share}: give the share of tokens masked, "
                    "above 0 and at most 1")
  if (config.corrupt == "tsv") != bool(config.corrupted):
    raise UserError("--corrupt tsv and --corrupted FILE go together (the TSV of corrupted rows)")
  if config.corrupted and not Path(config.corrupted).is_file():
    raise UserError(f"--corrupted {config.corrupted} does not exist: give a TSV of corrupted rows")
  for flag, value in (("--prune-step", config.prune_step), ("--prune-max", config.prune_max)):
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
      raise UserError(f"{flag} {value}: give a share of the heads, above 0 and at most 1")
  if config.mode != "remove" and not config.by:
    raise UserError(f"--mode {config.mode} applies to the groups of --by; --cross removes the "
                    "intra- or inter-sentence attention itself and --importance/--prune gate heads "
                    "to 0, so the mode would be ignored: drop --mode or add --by")



def check_analysis_model(config: AblationConfig, log=print) -> None:
  """Refuses (UserError) an ``--analysis`` directory whose run file says it analysed another
  model than ``--model`` (its roles or cluster types would be that model's); one line when the
  directory does not say which model it analysed."""
  if not config.analysis:
    return
  folder = Path(config.analysis)
  if not folder.is_dir():
    raise UserError(f"--analysis {folder} is not a directory: give the output directory of "
                    "`heads-jax analyze` on this model")
  try:
    run = contract.read_run(folder)
  except ValueError as e:
    raise UserError(f"--analysis {folder}: {e}") from None
  analysed = ((run or {}).get("inputs") or {}).get("model")
  same = None if analysed is None else same_model(analysed, config.model)
  if same is None:
    log(f"note: --analysis {folder} does not record which model it analysed (no content key "
        f"of the model in its {contract.RUN_FILE}); make sure it is an analysis of {config.model}")
    return
  if not same:
    model = (run.get("device") or {}).get("model")
    raise UserError(f"--analysis {folder} is an analysis of another model"
                    + (f" ({model})" if model else "") + f" than --model {config.model} (the "
                    "model files differ): its groups would be that model's heads; analyse this "
                    f"model (`heads-jax analyze --model {config.model} --out DIR`) and pass that DIR")



def _check_inputs(config: AblationConfig, log) -> None:
  """Every check that needs no model: values, the output directory, the SQuAD/GLUE flags, the
  classifier's task, the analysis's model."""
  check_config(config)
  runfiles.check_dir(config.out, "ablation", flag="--out")  # a file, another job's directory
  job = runfiles.read_job(config.out) if Path(config.out).is_dir() else None
  if job and job.get("model") not in (None, str(config.model)):
    raise UserError(f"--out {config.out} holds the ablation of {job['model']}, not of --model "
                    f"{config.model}: its files would be mixed with this model's; choose "
                    "another --out")
  if evaluate.is_squad_spec(config.data):
    if (config.importance or config.prune or config.finetune_data or config.attribution
        or config.patching):
      raise UserError("--importance, --prune, --attribution, --patching and --finetune-data are "
                      "for GLUE classifiers in this job; a SQuAD model takes --by, --cross and "
                      "--paper-tables (heads_jax.ablation.attribution and .patching take span "
                      "models as functions)")
  else:
    try:
      spec = parse_spec(config.data)
    except ValueError as e:
      raise UserError(str(e)) from None
    if spec.kind not in ("glue", "glue-tsv"):
      raise UserError(f"data spec {config.data!r} is not GLUE data; evaluation needs labels: use "
                      "glue:TASK[:SPLIT], glue-tsv:DIR/TASK[:SPLIT], sst2 or mrpc (or squad:FILE "
                      "for a SQuAD model)")
    check_classifier_task(config.model, glue.task_info(config.task or spec.task))
  if config.by and config.by != "layer" and config.by != "heads" and not config.analysis:
    raise UserError(f"--by {config.by} needs --analysis DIR (the output directory of `heads-jax "
                    "analyze` on this model)")
  if config.by == "heads" and not config.heads:
    raise UserError("--by heads needs --heads L:H,L:H (several groups separated by ';')")
  if config.cross and not (config.analysis or config.heads):
    raise UserError("--cross needs the heads: --analysis DIR [--cluster TYPE] or --heads L:H,...")
  if config.paper_tables and not config.analysis:
    raise UserError("--paper-tables needs the cluster types: --analysis DIR (an analysis of this "
                    "model with clusters.csv)")
  check_analysis_model(config, log)



def run_ablation(config: AblationConfig, log=print, *, redo: str | None = None,
                 progress: bool = True) -> dict:
  """Runs what ``config`` asks for on the stage engine (module docstring); writes into
  ``config.out``; returns ablation.json's content (settings, baseline, files, each part's
  record, report). ``redo``: a stage to rerun with every stage reading it (``baseline`` or
  ``"all"``: everything). ``progress=False``: no line per stage (a job inside another's stage)."""
  _check_inputs(config, log)   # before the lock: nothing is written for a bad request
  job = ablation_job(config, log)
  claim = {"kind": "ablation", "flag": "--out", "model": config.model, "data": config.data,
           "task": task_name(config),
           "settings": {"by": config.by, "cross": config.cross, "mode": config.mode,
                        "importance": config.importance, "prune": config.prune}}
  results = engine.run_pipeline(ablation_stages(job), config.out, config=job, redo=redo,
                                log=log, what="an ablation", claim=claim, progress=progress)
  return results[REPORT].outputs
