"""Baseline: the approach of the authors' notebooks (iitmnlp/heads-hypothesis), for comparison.

The released notebooks (``local_score.ipynb``, ``delimiter_score*.ipynb``, ``block_score.ipynb``,
``syntactic_score.ipynb``) read a pickle holding one numpy attention array per sentence
(``[layers, heads, 128, 128]``), produced beforehand by running BERT sentence batch by sentence
batch, and compute each sieve score with Python loops over sentences, layers, heads and query
tokens, a few numpy sums per token (e.g. for the band of width 2:
``np.sum(attn[token, lo:hi]) / band_size / (np.sum(attn[token, :]) / sent_len)``).

This module reproduces that approach faithfully, on the encoded batches of heads_jax:

1. **maps**: transformers' PyTorch ``BertModel`` (eager attention, ``output_attentions=True``,
   float32, ``torch.inference_mode``) on each batch; every sequence's maps are copied out as a
   numpy array ``[l, h, k, k]`` (k: the batch's padded length, at most 128; the notebooks'
   pickles hold 128 x 128 per sequence) and kept in a list, which is pickled to a temporary file
   and loaded back, as the notebooks read ``attention_weights_*.pkl`` (``--no-pickle`` skips
   that; either way the notebooks' separate runs per role, each loading the pickle again, are
   not imitated: one pass computes every role);
2. **loops**: for every sequence, the sieve of each query token is made once as an index array
   (the notebooks make word-piece index lists per sentence), then for every role, layer, head and
   query token the per-token bias is a couple of numpy reductions; the block role multiplies by
   the entropy of the query's row; the sequence score is the mean over queries with a non-empty
   sieve. Distance features (Guan et al.) are a ``np.bincount`` per (layer, head, query).

The scores follow DESIGN.md section 3 (the fixed local window, word-piece alignment by word ids,
dependent -> head direction), so on the same weights they agree with ``heads_jax`` to float
rounding; ``compare`` checks that. The timings are what matter here.

    python bench/bench_notebook_baseline.py                      # MiniLM (if installed), 64 sequences
    python bench/bench_notebook_baseline.py --sequences 16 --size tiny
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from heads_jax.data import vocabulary as B  # noqa: E402

RELATION_IDS = {"nsubj": B.REL_NSUBJ, "obj": B.REL_OBJ, "amod": B.REL_AMOD, "advmod": B.REL_ADVMOD}
SPECIAL_FEATURE = {B.TOKEN_CLS: 17, B.TOKEN_SEP: 18, B.TOKEN_COMMA: 19, B.TOKEN_PERIOD: 20}


# ------------------------------------------------------------------------------------------------
# Maps

def torch_device(setting: str = "auto") -> str:
  """``"cuda"`` when torch sees a GPU (the notebooks ran their PyTorch model on the GPU), else
  ``"cpu"``; or ``setting`` itself."""
  if setting != "auto":
    return setting
  import torch
  return "cuda" if torch.cuda.is_available() else "cpu"


def load_torch_model(hf_dir, device: str = "auto"):
  """transformers' PyTorch ``BertModel`` with eager attention (so it can return the maps), float32,
  on ``device`` (``torch_device``)."""
  from transformers import BertModel
  model = BertModel.from_pretrained(str(hf_dir), attn_implementation="eager")
  model.eval()
  return model.to(torch_device(device))


def produce_maps(torch_model, batches) -> tuple[list, list, list]:
  """Runs ``torch_model`` on every ``(indices, batch)``; returns ``(indices, maps, rows)``, one
  entry per real sequence: its dataset index, its maps float32 ``[l, h, k, k]`` (numpy) and its
  batch fields (``[k]`` each)."""
  import torch
  indices, maps, rows = [], [], []
  device = next(torch_model.parameters()).device
  tensor = lambda x: torch.from_numpy(np.asarray(x, np.int64)).to(device)  # noqa: E731
  with torch.inference_mode():
    for idx, batch in batches:
      out = torch_model(input_ids=tensor(batch["input_ids"]),
                        attention_mask=tensor(batch["attention_mask"]),
                        token_type_ids=tensor(batch["token_type_ids"]), output_attentions=True)
      attn = torch.stack(out.attentions, dim=1).cpu().numpy()     # [b, l, h, k, k] on the host
      for i, j in enumerate(np.asarray(idx)):
        if j < 0:
          continue
        indices.append(int(j))
        maps.append(attn[i].copy())                               # one array per sequence
        rows.append({f: np.asarray(v)[i] for f, v in batch.items()})
  return indices, maps, rows


def choose_torch_threads(setting: str, torch_model, first: list) -> tuple[int, dict]:
  """Sets and returns torch's threads for the maps: ``setting`` as a number, or for ``"auto"``
  the faster of (cores, 1) at producing the maps of the batches ``first`` (on a shared machine
  torch's OpenMP threads can wait on each other at every operator; the baseline gets the better
  setting). Also returns the trial's seconds per setting."""
  if setting != "auto":
    return common.set_torch_threads(int(setting)), {}
  trial = {}
  for th in dict.fromkeys((common.available_cores(), 1)):
    common.set_torch_threads(th)
    produce_maps(torch_model, first)                 # warm-up
    with common.Timer() as t:
      produce_maps(torch_model, first)
    trial[th] = round(t.wall, 3)
  best = min(trial, key=trial.get)
  return common.set_torch_threads(best), trial


# ------------------------------------------------------------------------------------------------
# Loops

def sieve_index_lists(row: dict, role: str) -> list:
  """For each query t < n, the key positions of S(t) as an int array (empty when S(t) is)."""
  n = int(np.sum(row["attention_mask"]))
  tt, tc = row["token_type_ids"][:n], row["token_class"][:n]
  wid, head, rel = row["word_ids"][:n], row["dep_head"][:n], row["dep_rel"][:n]
  empty = np.zeros(0, np.int64)
  seps = [x for x in range(n) if tc[x] == B.TOKEN_SEP]
  out = []
  for t in range(n):
    if role == "local":
      s = list(range(max(0, t - 2), min(n, t + 3)))
    elif role == "prev_local":
      s = list(range(max(0, t - 2), t))
    elif role == "next_local":
      s = list(range(t + 1, min(n, t + 3)))
    elif role in ("block", "block_plain"):
      s = []
      if any(tt[x] == 1 for x in range(n)):
        s = [x for x in range(n) if tt[x] == tt[t] and tc[x] not in (B.TOKEN_CLS, B.TOKEN_SEP)]
    elif role == "cls":
      s = [0]
    elif role == "sep":
      s = seps
    elif role == "delimiter":
      s = sorted({0, *seps})
    elif role in RELATION_IDS or role == "syntactic":
      rels = RELATION_IDS.values() if role == "syntactic" else [RELATION_IDS[role]]
      s = []
      if rel[t] in rels and head[t] >= 0:
        s = [x for x in range(n) if wid[x] == head[t]]
    else:
      raise ValueError(f"unknown role {role!r}")
    out.append(np.asarray(s, np.int64) if s else empty)
  return out


def notebook_sieve_bias(maps: np.ndarray, row: dict, roles) -> np.ndarray:
  """float64 ``[l, h, r]`` of one sequence (``maps`` ``[l, h, k, k]``), loops as the notebooks."""
  n = int(np.sum(row["attention_mask"]))
  l, h = maps.shape[:2]
  out = np.full((l, h, len(roles)), np.nan)
  for j, role in enumerate(roles):
    sieves = sieve_index_lists(row, role)
    with_entropy = role == "block"
    if not any(len(s) for s in sieves):
      continue
    for li in range(l):
      for hi in range(h):
        attn = maps[li, hi, :n, :n]
        score, count = 0.0, 0
        for t in range(n):
          s = sieves[t]
          if not len(s):
            continue
          avg_over_all = np.sum(attn[t, :]) / n
          token_score = np.sum(attn[t, s]) / len(s) / avg_over_all
          if with_entropy:
            p = attn[t, :]
            p = p[p > 0]
            token_score *= -np.sum(p * np.log(p))
          score += token_score
          count += 1
        out[li, hi, j] = score / count
  return out


def notebook_distance(maps: np.ndarray, row: dict) -> np.ndarray:
  """float64 ``[l, h, 21]`` of one sequence: per (layer, head, query) a bincount over keys."""
  n = int(np.sum(row["attention_mask"]))
  tc = row["token_class"][:n]
  l, h = maps.shape[:2]
  bins = np.empty((n, n), np.int64)          # feature index of key s for query t
  for t in range(n):
    for s in range(n):
      if s == t:
        bins[t, s] = 16
      elif tc[s] in SPECIAL_FEATURE:
        bins[t, s] = SPECIAL_FEATURE[tc[s]]
      else:
        bins[t, s] = min(15, (16 * abs(s - t)) // n)
  out = np.zeros((l, h, 21))
  for li in range(l):
    for hi in range(h):
      attn = maps[li, hi, :n, :n]
      acc = np.zeros(21)
      for t in range(n):
        acc += np.bincount(bins[t], weights=attn[t], minlength=21)
      out[li, hi] = acc / n
  return out


def notebook_scores(maps: list, rows: list, roles, distance: bool = True) -> dict:
  """Sieve bias ``[N, l, h, r]`` and distance ``[N, l, h, 21]`` of the stored maps (numpy)."""
  sb = np.stack([notebook_sieve_bias(m, r, roles) for m, r in zip(maps, rows)])
  out = {"sieve_bias": sb}
  if distance:
    out["distance"] = np.stack([notebook_distance(m, r) for m, r in zip(maps, rows)])
  return out


def pickle_round_trip(maps: list, directory) -> list:
  """Writes the list of maps to a pickle in ``directory`` and reads it back (the notebooks'
  ``attention_weights_*.pkl``); the file is removed afterwards."""
  import os
  import pickle
  import tempfile
  fd, path = tempfile.mkstemp(suffix=".pkl", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      pickle.dump(maps, f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path, "rb") as f:
      return pickle.load(f)
  finally:
    os.remove(path)


def run_baseline(torch_model, batches, roles=B.ROLES, distance: bool = True,
                 pickle_dir=None) -> dict:
  """The whole baseline on ``batches`` (a list of ``(indices, batch)``): maps, then (if
  ``pickle_dir``) a pickle round trip of the maps through that folder, then the loops.

  Returns ``sieve_bias`` / ``distance`` in dataset order of the indices seen, ``indices``,
  ``maps_s``, ``pickle_s`` and ``loops_s`` (seconds), ``maps_mib`` (memory of the stored maps).
  """
  t0, c0 = time.perf_counter(), time.process_time()
  indices, maps, rows = produce_maps(torch_model, batches)
  t1, c1 = time.perf_counter(), time.process_time()
  if pickle_dir is not None:
    maps = pickle_round_trip(maps, pickle_dir)
  t2, c2 = time.perf_counter(), time.process_time()
  scores = notebook_scores(maps, rows, roles, distance)
  t3, c3 = time.perf_counter(), time.process_time()
  order = np.argsort(indices)
  out = {k: v[order] for k, v in scores.items()}
  out.update(indices=np.asarray(indices)[order], maps_s=t1 - t0, pickle_s=t2 - t1, loops_s=t3 - t2,
             maps_cpu_s=c1 - c0, pickle_cpu_s=c2 - c1, loops_cpu_s=c3 - c2,
             maps_mib=sum(m.nbytes for m in maps) / 2**20)
  return out


def compare(baseline: dict, ours: dict) -> dict:
  """Largest absolute and relative differences between the baseline's and heads_jax's scores on
  the same sequences (``ours`` indexed by the baseline's ``indices``); NaN patterns must match."""
  idx = baseline["indices"]
  out = {}
  for key in ("sieve_bias", "distance"):
    if key not in baseline:
      continue
    a = np.asarray(baseline[key], np.float64)
    b = np.asarray(ours[key], np.float64)[idx]
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both = ~nan_a & ~nan_b
    diff = np.abs(a[both] - b[both])
    out[key] = {"nan_pattern_equal": bool(np.array_equal(nan_a, nan_b)),
                "max_abs_diff": float(diff.max()) if diff.size else 0.0,
                "max_rel_diff": float((diff / np.maximum(np.abs(b[both]), 1e-6)).max()) if diff.size else 0.0}
  return out


# ------------------------------------------------------------------------------------------------
# CLI (the baseline alone; bench_analysis.py runs it beside heads_jax)

def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  common.add_model_args(p, sequences=64)
  p.add_argument("--threads", default="auto", help="torch threads: a number, or 'auto' = the "
                 "faster of (cores, 1) on the first batch")
  p.add_argument("--no-pickle", action="store_true", help="keep the maps in memory (default: "
                 "pickle them to disk and load them back, as the notebooks)")
  p.add_argument("--check", action="store_true", help="also run heads_jax's analysis step on the "
                 "same batches and report the largest differences")
  p.add_argument("--no-distance", action="store_true", help="sieve bias only")
  p.add_argument("--out", default=None, help="JSON path (default: next to this script)")
  return p.parse_args(argv)


def default_hf_dir(size: str, tmp: Path, prefer_minilm: bool = True) -> tuple[Path, str]:
  """``(directory, name)``: all-MiniLM-L6-v2 when installed (and ``prefer_minilm``), else a
  random ``size`` model (seed 0) exported to ``tmp`` as a Hugging Face directory."""
  if prefer_minilm:
    sys.path.insert(0, str(common.REPO))
    from tests.helpers import minilm_dir
    d = minilm_dir()
    if d is not None:
      return d, "all-MiniLM-L6-v2"
  from flax import nnx
  from heads_jax.data.tokenizer import load_tokenizer
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.model.convert import export_hf
  tok = load_tokenizer()
  model = BertModel(config_for(size, vocab_size=tok.vocab_size), rngs=nnx.Rngs(0))
  export_hf(model, tok, tmp)
  return tmp, f"{size} (random init)"


def main(argv=None):
  import tempfile
  args = _parse(argv)
  print(common.device_header(common.machine_info(jax_devices=args.check)))
  from heads_jax.data.specs import encode_spec
  with tempfile.TemporaryDirectory() as tmp:
    hf_dir, name = ((Path(args.hf_dir), str(args.hf_dir)) if args.hf_dir
                    else default_hf_dir(args.size, Path(tmp) / "model", prefer_minilm=not args.random))
    from transformers import BertTokenizerFast
    tokenizer = BertTokenizerFast.from_pretrained(str(hf_dir))
    _, batches, _ = encode_spec("ud-ewt", tokenizer, max_length=args.max_length,
                                batch_size=args.batch_size, max_examples=args.sequences)
    batches = list(batches)
    model = load_torch_model(hf_dir)
    threads, _ = choose_torch_threads(args.threads, model, batches[:1])
    res = run_baseline(model, batches, distance=not args.no_distance,
                       pickle_dir=None if args.no_pickle else tmp)
    agreement = None
    if args.check:
      from heads_jax import load_model
      from heads_jax.stats.collector import collect
      from heads_jax.stats.step import make_analysis_step
      jax_model, _ = load_model(hf_dir)
      ours = collect(make_analysis_step(jax_model), batches, len(res["indices"]), progress=False)
      agreement = compare(res, ours)
  n = len(res["indices"])
  total = res["maps_s"] + res["pickle_s"] + res["loops_s"]
  row = {"model": name, "sequences": n, "maps_s": round(res["maps_s"], 3),
         "pickle_s": round(res["pickle_s"], 3), "loops_s": round(res["loops_s"], 3),
         "total_s": round(total, 3),
         "seq_per_s": round(n / total, 3), "maps_mib": round(res["maps_mib"], 1),
         "torch_threads": threads}
  print(common.format_table([row], title="notebook baseline (torch maps + numpy loops), CPU"))
  if agreement:
    print("agreement with heads_jax: " + "; ".join(
        f"{k}: max abs diff {v['max_abs_diff']:.2e}, NaN pattern equal {v['nan_pattern_equal']}"
        for k, v in agreement.items()))
  path = common.write_json(common.default_json_path(__file__, args.out),
                           {"machine": common.machine_info(jax_devices=args.check),
                            "command": common.command_line(), "result": row,
                            "agreement_with_heads_jax": agreement})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
