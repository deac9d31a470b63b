"""The demo's front page text (`heads_jax.pipelines.demo`): what each of its models can and
cannot show, with the run's own numbers (read through `heads_jax.contract`)."""

from __future__ import annotations

from heads_jax import contract
from heads_jax.hoststats.intervals import wilson_interval
from heads_jax.report.page import esc


def pct(v) -> str:
  return "n/a" if v is None else f"{100 * v:.1f}%"


def _block_counts(summary) -> tuple[int | None, int | None]:
  """Block heads under the paper's and the calibrated rule (None where the run lacks a rule)."""
  if summary is None:
    return None, None
  by_rule = summary.get("by_rule") or {}
  get = lambda r: ((by_rule.get(r) or {}).get("num_heads_by_coarse_role") or {}).get("block")
  return get("paper"), get("calibrated")


def front_page_text(name: str, parts: dict, *, n: int, finetune_steps: int = 0,
                    pretrain_steps: int = 0) -> dict:
  """What the front page says about a finished run: its description, and what each model can
  and cannot show, with the run's own numbers (``parts``: the stages' results)."""
  summaries = {k: s for k, s in ((k, contract.load_summary(v, missing_ok=True))
                                  for k, v in (parts.get("analyses") or {}).items()) if s is not None}
  if parts.get("quick"):
    return {"description": (
        f"Quick mode: the attention heads of {name}, a real pre-trained BERT encoder, on {n} UD "
        f"EWT test sentences (gold parses, for the syntactic roles) and {n} MRPC sentence pairs "
        "(for the block role), with sieve bias scores and hypothesis tests (Pande et al., AAAI "
        "2021) and distance-feature clustering (Guan et al., COLING 2020). The full demo adds "
        "fine-tuning on SST-2 and the before/after comparison."), "notes": []}
  real = summaries.get(f"{name} (pre-trained)")
  paper_block, cal_block = _block_counts(real)
  body = [
      f"<p><b>{esc(name)}</b> is a real pre-trained encoder (trained by its authors on a large "
      "corpus): its heads are what the paper's findings are about, and its roles, overlaps and "
      "layer pattern can be set beside the paper's BERT-base. Caveats: it is smaller (6 layers x 12 "
      f"heads) and distilled, so the shares need not match, and {n} sentences plus {n} pairs are "
      "few, so a weak role may go undetected."
      + (f" Of the {paper_block} block heads the paper's rule finds, {cal_block} score "
         "significantly above what uniform attention would (the calibrated rule, the default); "
         "under the paper's rule uniform attention itself is a block head, since its block score "
         "is ln n, about 3.9 on these pairs, above tau = 3 (DESIGN.md section 3)."
         if paper_block is not None and cal_block is not None else "") + "</p>"]
  ft = (parts.get("finetune") or {}).get("best") or {}
  if "accuracy" in ft:
    held = int(parts.get("finetune_heldout") or 0)
    ci = (" (95% Wilson interval {:.1f}% to {:.1f}%)".format(
        *(100 * x for x in wilson_interval(round(ft["accuracy"] * held), held))) if held else "")
    body.append(
        f"<p><b>Fine-tuned (SST-2)</b>: {esc(name)} after {finetune_steps} steps on "
        f"{parts.get('finetune_train', '?')} SST-2 sentences, evaluated once, at the end, on "
        f"{held} held-out ones: accuracy {pct(ft['accuracy'])}{ci}. The comparison (the paper's "
        "Fig. 6) shows how fine-tuning moved the mean sieve bias of each role per layer group, on "
        "the same sequences as before.</p>")
  pre = parts.get("pretrain") or {}
  if pre:
    evals = [e for e in pre.get("eval") or [] if "mlm_loss" in e]
    last = evals[-1] if evals else {}
    scratch = summaries.get("pre-trained from scratch (demonstration)")
    loss, uni = last.get("mlm_loss"), last.get("unigram_baseline")
    learned = ("" if loss is None or uni is None else
               f" After {pretrain_steps} steps its held-out MLM loss is {loss:.2f} nats per "
               f"wordpiece against the unigram baseline's {uni:.2f} (the loss of a model that "
               "ignores the context): "
               + scratch_verdict(loss, uni))
    heads = (scratch.num_layers or 0) * (scratch.num_heads or 0) if scratch else 0
    near = scratch.num_near_uniform_heads if scratch else None
    paper_block, cal_block = _block_counts(scratch)
    roles = ("" if not scratch else
             f" Its heads: {near if near is not None else 'n/a'} of {heads} have near-uniform "
             f"attention; {pct(1 - scratch.get('share_unskilled', 1.0))} get a role under the "
             "default rule"
             + (f" (the paper's rule would call {paper_block} of them block heads)"
                if paper_block else "") + ".")
    body.append(
        "<p><b>Pre-trained from scratch</b>: a demonstration that the pre-training pipeline runs "
        "(MLM + NSP with LAMB on the embedded books)." + learned + roles
        + " A model trained for minutes shows none of the paper's findings and is not to be "
        "compared with the paper; it shows what an untrained-looking model scores.</p>")
  return {"description": (
      f"The paper's analysis on a real pre-trained BERT encoder ({name}): its attention heads "
      "before and after fine-tuning on SST-2, with sieve bias scores and hypothesis tests "
      "(Pande et al., AAAI 2021) and distance-feature clustering (Guan et al., COLING 2020)"
      + ("; and, as a demonstration of the pre-training pipeline, a small BERT pre-trained from "
         "scratch for a few minutes." if pre else ".")),
      "notes": [("What these models can and cannot show", "".join(body))]}


def scratch_verdict(loss: float, unigram: float, *, near: float = 0.05) -> str:
  """What a held-out MLM ``loss`` says against the unigram baseline (both in nats per
  wordpiece): below it by more than ``near``, the model uses the context; within ``near``, it
  knows word frequencies only; above it, not even those."""
  if loss < unigram - near:
    return "it has begun to use the context, a little."
  if loss <= unigram + near:
    return "about as good as word frequencies alone: it has not yet learned to use the context."
  return (f"{loss - unigram:.2f} nats worse than word frequencies alone: it has not yet learned "
          "even those, let alone the context.")
