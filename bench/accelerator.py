"""The accelerator suite (issue 35): every speed figure of heads_jax on one device, in one run.

    python bench/accelerator.py --out bench/results/accelerator     # on a GPU: under 8 minutes
    python bench/accelerator.py --tiny --out /tmp/acc                # CPU smoke (tests/e2e)

Parts, in this order, each in its own process under its own time limit (``--limits``); each
writes its rows as it measures them, and after every part the suite rewrites
``OUT/accelerator.json`` and ``OUT/accelerator.md``, so a cut run keeps what it measured (a part
cut by its limit says so in both files):

* ``doctor``: ``heads_jax.doctor``'s checks (every attention and analysis path against the
  float32 reference) and its timings (BERT-base analysis and pre-training steps, batch
  ``heads_jax.doctor.ACCELERATOR_BATCH`` = 256 on accelerators);
* ``pretrain``: heads_jax's pre-training step (LAMB) at sequence 128 and 512 with attention
  dropout 0.1 (explicit attention, BERT's) and 0.0 (fused attention), with its breakdown into
  forward, backward and optimizer (``bench/bench_pretrain_mfu.py``'s ``run_setting``);
* ``torch_peer``: transformers' ``BertForPreTraining`` on the same work, eager and under
  ``torch.compile`` (``bench/torch_peer.py``; CUDA: bf16 autocast, SDPA, fused AdamW);
* ``analysis_step``: the analysis step (``make_analysis_step(measures=True)``) for every
  ``stats_impl`` against the bare jitted forward and the forward returning attentions on the
  same batch, and what ``auto`` takes;
* ``analyze``: ``heads-jax analyze`` end to end (both passes, no report) on 2,000 UD EWT
  sentences, once with an empty persistent compilation cache and once with it warm;
* ``notebook``: the authors' notebook approach (``bench/bench_notebook_baseline.py``: torch
  maps, pickled, numpy loops) on 64 sequences beside heads_jax's analysis step on the same ones.

Ratios are taken between figures of the same run. ``--tiny`` runs tiny models, a few sequences,
no ``torch.compile`` (minutes of C++ compilation on a CPU) and float32: it checks that every part
runs, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from analysis_ab import part_analysis_ab  # noqa: E402,F401  (issue 38: the part analysis_ab)
from pretrain_ab import part_pretrain_ab  # noqa: E402,F401  (issue 39: the part pretrain_ab)

PARTS = ("doctor", "pretrain", "torch_peer", "analysis_step", "analyze", "notebook", "analysis_ab",
         "pretrain_ab")
# seconds per part on a GPU (bench/device_run.sh runs analysis_ab and pretrain_ab in 9 minutes)
LIMITS = {"doctor": 45, "pretrain": 130, "torch_peer": 100, "analysis_step": 70, "analyze": 95,
          "notebook": 35, "analysis_ab": 130, "pretrain_ab": 330}
TINY_LIMITS = {name: 900 for name in PARTS}   # a shared 2-core CPU: a bound against hangs only

FULL = {"size": "base", "dtype": "bfloat16", "pretrain": [(128, 256, 20), (512, 32, 80)],
        "pretrain_steps": 10, "repeats": 3, "peer": (256, 128, 20), "peer_compile": True,
        "analysis_batch": (128, 128), "analysis_steps": 10, "sentences": 2000,
        "notebook_sequences": 64, "batch_size": 32}
TINY = {"size": "tiny", "dtype": "float32", "pretrain": [(32, 4, 5)], "pretrain_steps": 1,
        "repeats": 1, "peer": (4, 32, 5), "peer_compile": False, "analysis_batch": (8, 32),
        "analysis_steps": 1, "sentences": 8, "notebook_sequences": 8, "batch_size": 8}


class Part:
  """A part's rows, appended to its JSON-lines file as they come (``row``)."""

  def __init__(self, path: Path):
    self.path = path

  def row(self, what: str, value, unit: str = "", ratio: str = "", **detail) -> None:
    entry = {"what": what, "value": value, "unit": unit, "ratio": ratio, "detail": detail}
    with open(self.path, "a") as f:
      f.write(json.dumps(entry, default=common._json_default) + "\n")
    print(f"  {what}: {_fmt(value)} {unit} {ratio}".rstrip(), flush=True)


def _fmt(v) -> str:
  if isinstance(v, float):
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
  return str(v)


def _median_seconds(fn, steps: int, repeats: int) -> float:
  """Median over ``repeats`` of the seconds per call of ``fn`` (blocking), after one warm call."""
  import jax
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(steps):
      out = fn()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / steps)
  return float(np.median(times))


# ------------------------------------------------------------------------------------------------
# Parts (each runs in a child process: `--_part NAME`)

def part_doctor(p: Part, s: dict, tiny: bool) -> None:
  from heads_jax import doctor
  lines = []
  res = doctor.run_doctor(quick=tiny, timing=True, steps_=s["analysis_steps"] + 2,
                          out=lines.append)
  for c in res["checks"]:  # dicts: the fields of doctor.Check and "ok"
    verdict = "skipped" if c["skipped"] else ("ok" if c["ok"] else "MISMATCH")
    p.row(f"check {c['name']} {c['dtype']}", c["error"], "rel. error", verdict,
          tolerance=c["tolerance"], note=c["note"])
  for t in res["timings"]:
    p.row(f"doctor {t['name']}, batch {t['batch']} x {t['seq_len']} {t['dtype']}",
          t["tokens_per_s"], "tokens/s", "" if t["mfu"] is None else f"MFU {100 * t['mfu']:.1f}%",
          step_s=t["step_s"])
  p.row("doctor verdict", "ok" if res["ok"] else "problems", "", "", lines=lines)


def part_pretrain(p: Part, s: dict, tiny: bool) -> None:
  from bench_pretrain_mfu import run_setting
  for seq, batch, preds in s["pretrain"]:
    for rate in (0.1, 0.0):
      r = run_setting(s["size"], seq, batch, preds, s["dtype"], rate, "lamb", s["pretrain_steps"],
                      s["repeats"], breakdown=True)
      b = r["breakdown_s"]
      mfu = f"MFU {100 * r['mfu']:.1f}%" if "mfu" in r else ""
      p.row(f"pre-training {s['size']} seq {seq} batch {batch}, attention dropout {rate} "
            f"({r['attention_path']})", r["tokens_per_s"], "tokens/s", mfu,
            step_ms=1e3 * r["step_s"], forward_ms=1e3 * b["forward"],
            backward_ms=1e3 * b["backward"], optimizer_in_step_ms=1e3 * b["optimizer_in_step"],
            optimizer_alone_ms=1e3 * b["optimizer_alone"], loss=r["loss"],
            attention_path=r["attention_path"], mfu=r.get("mfu"),
            non_embedding_params=r["non_embedding_params"],
            flops_per_token=r["flops_per_token"])


def part_torch_peer(p: Part, s: dict, tiny: bool) -> None:
  from torch_peer import run_peer
  batch, seq, preds = s["peer"]
  peak = _peak("bfloat16" if not tiny else "float32")
  for compiled in ((False, True) if s["peer_compile"] else (False,)):
    r = run_peer(size=s["size"], batch=batch, seq=seq, preds=preds, steps=s["pretrain_steps"],
                 repeats=s["repeats"], compile=compiled, peak=peak)
    p.row(f"torch peer {'torch.compile' if compiled else 'eager'}, seq {seq} batch {batch}, "
          f"dropout 0.1", r["tokens_per_s"], "tokens/s",
          f"MFU {100 * r['mfu']:.1f}%" if r.get("mfu") else "", step_ms=1e3 * r["step_s"],
          warmup_s=r["warmup_s"], device=r["device"], torch=r["torch"])


def _peak(dtype: str):
  import jax
  dev = jax.devices()[0]
  if dev.platform == "cpu":
    return None
  return common.accelerator_peak_flops(dev.device_kind, dtype)["flops"]


def analysis_batch(b: int, q: int, seed: int = 0) -> dict:
  """A full-length analysis batch ``[b, q]`` of random ids: pairs (types 0 then 1), [CLS] and
  [SEP] classes, one word per piece, no arcs."""
  rng = np.random.default_rng(seed)
  batch = {f: np.zeros((b, q), np.int32) for f in
           ("input_ids", "attention_mask", "token_type_ids", "token_class", "word_ids",
            "dep_head", "dep_rel")}
  batch["input_ids"] = rng.integers(1000, 30000, (b, q)).astype(np.int32)
  batch["attention_mask"][:] = 1
  batch["token_type_ids"][:, q // 2:] = 1
  batch["token_class"][:, 0], batch["token_class"][:, -1] = 1, 2
  batch["word_ids"][:] = np.arange(q)[None] - 1
  batch["word_ids"][:, -1] = -1
  batch["dep_head"][:] = -1
  return batch


def part_analysis_step(p: Part, s: dict, tiny: bool) -> None:
  import jax
  from flax import nnx
  from heads_jax.model.bert import BertModel
  from heads_jax.model.config import config_for
  from heads_jax.parallel import data_mesh, replicate, shard_batch
  from heads_jax.stats.step import STATS_IMPLS, make_analysis_step
  b, q = s["analysis_batch"]
  model = BertModel(config_for(s["size"], vocab_size=30522, dtype=s["dtype"]), rngs=nnx.Rngs(0))
  batch = analysis_batch(b, q)
  mesh = data_mesh()
  graphdef, state = nnx.split(model)
  state = replicate(state, mesh)
  device_batch = shard_batch({f: batch[f] for f in ("input_ids", "attention_mask",
                                                    "token_type_ids")}, mesh)

  def forward(attentions):
    @jax.jit
    def run(st, bt):
      out = nnx.merge(graphdef, st)(bt["input_ids"], bt["attention_mask"], bt["token_type_ids"],
                                    return_attentions=attentions)
      return out["attentions"] if attentions else out["last_hidden_state"]
    return lambda: run(state, device_batch)

  steps, reps = s["analysis_steps"], s["repeats"]
  bare = _median_seconds(forward(False), steps, reps)
  p.row(f"bare forward, batch {b} x {q} {s['dtype']}", 1e3 * bare, "ms/step", "1.00")
  with_attn = _median_seconds(forward(True), steps, reps)
  p.row("forward returning attentions", 1e3 * with_attn, "ms/step", f"{with_attn / bare:.2f}")
  auto = make_analysis_step(model, measures=True)
  p.row("auto takes", auto.path_for(b, q), "", "", platform=auto.platform)
  for impl in STATS_IMPLS[1:]:
    step = make_analysis_step(model, measures=True, stats_impl=impl)
    built = step.with_tables(batch)   # the kernel's tables, built on the host as analyze's builders do
    t0 = time.perf_counter()
    jax.block_until_ready(step.submit(built)._outputs)
    compile_s = time.perf_counter() - t0
    secs = _median_seconds(lambda: step.submit(built)._outputs, steps, reps)
    p.row(f"analysis step, {impl}", 1e3 * secs, "ms/step", f"{secs / bare:.2f}",
          compile_s=compile_s, vs_forward_attn=secs / with_attn)


def part_analyze(p: Part, s: dict, tiny: bool, work: Path) -> None:
  from bench_notebook_baseline import default_hf_dir
  model_dir, name = default_hf_dir(s["size"], work / "model", prefer_minilm=False)
  cache = work / "jax_cache"
  n = s["sentences"]
  env = dict(os.environ, HEADS_JAX_CACHE_DIR=str(cache))
  for label in ("cold (empty compilation cache)", "warm compilation cache"):
    out = work / f"analysis_{len(list(work.glob('analysis_*')))}"
    cmd = [sys.executable, "-m", "heads_jax.cli", "analyze", "--model", str(model_dir),
           "--data", "ud-ewt", "--max-examples", str(n), "--batch-size", str(s["batch_size"]),
           "--examples", "0", "--no-report", "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
      raise SystemExit(f"heads-jax analyze failed ({done.returncode}): {done.stderr[-2000:]}")
    p.row(f"heads-jax analyze, {name}, {n} UD EWT sentences, both passes, {label}", n / wall,
          "sequences/s", f"{wall:.1f} s", wall_s=wall, command=" ".join(cmd))


def part_notebook(p: Part, s: dict, tiny: bool, work: Path) -> None:
  import bench_notebook_baseline as nb
  from heads_jax import load_model
  from heads_jax.data.specs import encode_spec
  from heads_jax.stats.collector import collect
  from heads_jax.stats.step import make_analysis_step
  model_dir, name = nb.default_hf_dir(s["size"], work / "model_nb", prefer_minilm=False)
  model, tokenizer = load_model(model_dir)
  m = s["notebook_sequences"]
  _, batches, total = encode_spec("ud-ewt", tokenizer, max_length=128, batch_size=min(32, m),
                                  max_examples=m, sort_window=1024, pad_to_batch_size=True)
  batches = list(batches)
  step = make_analysis_step(model)
  ours = collect(step, batches, total, progress=False)         # compiles
  t0 = time.perf_counter()
  ours = collect(step, batches, total, progress=False)
  ours_s = time.perf_counter() - t0
  torch_model = nb.load_torch_model(model_dir)
  res = nb.run_baseline(torch_model, batches, pickle_dir=str(work))
  theirs_s = res["maps_s"] + res["pickle_s"] + res["loops_s"]
  agree = nb.compare(res, ours)
  p.row(f"notebook approach, {name}, {total} sequences (torch maps, pickle, numpy loops)",
        total / theirs_s, "sequences/s", "", maps_s=res["maps_s"], pickle_s=res["pickle_s"],
        loops_s=res["loops_s"], agreement=agree)
  p.row(f"heads_jax analysis step on the same {total} sequences", total / ours_s, "sequences/s",
        f"{theirs_s / ours_s:.1f}x the notebook")


def _run_part(name: str, args, settings: dict) -> None:
  work = Path(args._work)
  p = Part(Path(args._rows))
  if name in ("analyze", "notebook"):
    globals()[f"part_{name}"](p, settings, args.tiny, work)
  else:
    globals()[f"part_{name}"](p, settings, args.tiny)


# ------------------------------------------------------------------------------------------------
# The suite

def write_outputs(out: Path, result: dict) -> None:
  """``accelerator.json`` and ``accelerator.md`` (one table: part, what, figure, ratio)."""
  common.write_json(out / "accelerator.json", result)
  lines = [f"# heads_jax accelerator suite", "",
           f"{result['device']}; commit {result.get('commit')}; {result['versions']}; "
           f"{result['date_utc']} UTC; `{result['command']}`", "",
           "| part | what | figure | unit | ratio / note |", "|---|---|---|---|---|"]
  for part in result["parts"]:
    for r in part["rows"]:
      lines.append(f"| {part['name']} | {r['what']} | {_fmt(r['value'])} | {r['unit']} | "
                   f"{r['ratio']} |")
    if part["status"] != "done":
      lines.append(f"| {part['name']} | ({part['status']}) | | | |")
  lines += ["", "Part times: " + ", ".join(f"{p['name']} {p['seconds']:.0f} s "
                                            f"(limit {p['limit_s']})" for p in result["parts"])]
  (out / "accelerator.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=str(common.REPO / "bench" / "results" / "accelerator"),
                  help="folder of accelerator.json and accelerator.md")
  ap.add_argument("--tiny", action="store_true", help="tiny settings (CPU smoke test)")
  ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
  ap.add_argument("--limits", default="", help="NAME=SECONDS,... overriding the time limits "
                  f"{LIMITS}")
  ap.add_argument("--_part", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--_rows", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--_work", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  settings = TINY if args.tiny else FULL
  if args._part:
    _run_part(args._part, args, settings)
    return
  parts = [x.strip() for x in args.parts.split(",") if x.strip()]
  unknown = [x for x in parts if x not in PARTS]
  if unknown:
    print(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}", file=sys.stderr)
    sys.exit(2)
  limits = dict(TINY_LIMITS if args.tiny else LIMITS)
  for item in filter(None, args.limits.split(",")):
    key, _, value = item.partition("=")
    if key not in LIMITS or not value.replace(".", "", 1).isdigit():
      print(f"--limits takes NAME=SECONDS with NAME in {PARTS}; got {item!r}", file=sys.stderr)
      sys.exit(2)
    limits[key] = float(value)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  info = common.machine_info(torch_threads=False)
  print(common.device_header(info), flush=True)
  accel = info.get("accelerator")
  result = {"device": accel if accel and "none" not in str(accel) else info.get("jax_devices"),
            "versions": ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v),
            "date_utc": info["date_utc"], "commit": info["git_commit"],
            "command": common.command_line(), "machine": info,
            "settings": settings, "parts": []}
  write_outputs(out, result)
  with tempfile.TemporaryDirectory() as tmp:
    for name in parts:
      rows_file = Path(tmp) / f"{name}.jsonl"
      work = Path(tmp) / name
      work.mkdir()
      cmd = [sys.executable, __file__, "--_part", name, "--_rows", str(rows_file),
             "--_work", str(work)] + (["--tiny"] if args.tiny else [])
      print(f"{name} (limit {limits[name]:.0f} s)", flush=True)
      t0 = time.perf_counter()
      try:
        done = subprocess.run(cmd, timeout=limits[name], stdout=sys.stdout, stderr=subprocess.PIPE,
                              text=True)
        status = "done" if done.returncode == 0 else (
            f"failed ({done.returncode}): " + " ".join(done.stderr.strip().splitlines()[-1:])[:300])
      except subprocess.TimeoutExpired:
        status = f"cut at its limit of {limits[name]:.0f} s"
      seconds = time.perf_counter() - t0
      rows = ([json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
              if rows_file.exists() else [])
      result["parts"].append({"name": name, "status": status, "seconds": seconds,
                              "limit_s": limits[name], "rows": rows})
      if status != "done":
        print(f"  {name}: {status}", flush=True)
      write_outputs(out, result)
  print(f"wrote {out / 'accelerator.json'} and {out / 'accelerator.md'}")


if __name__ == "__main__":
  main()
