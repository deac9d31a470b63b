"""The head view of the report: a few example sequences per head and their attention maps.

The analysis pass never keeps attention maps (DESIGN.md section 2). Once the scores and tests
are written, `write_head_examples` chooses a few sequences per head from ``scores.npz`` and
``tests.csv`` (`choose_examples`), runs a second, small forward pass over those sequences only
(`example_maps`), and writes ``examples.json`` (DESIGN.md section 4) with their tokens and the
chosen heads' maps, which the report's head view shows.

Choosing (host-side numpy):

* the head's *view roles* are its assigned roles (the run's rule), in role order; a head with no
  role gets its strongest role, the one with the largest test statistic (scale-free across roles,
  unlike the means: ``block`` scores carry an entropy factor);
* the examples are taken in turns over the view roles: the sequence with the highest sieve bias
  for the first role, then for the second, ..., then the second highest of each, and so on, each
  sequence at most once per head, ``per_head`` in all;
* only sequences of at most ``max_tokens`` positions are candidates (the view stays readable and
  the file small) unless none of a role's scored sequences is that short; a sequence whose score
  for the role is NaN (empty sieve) is never chosen for it. Ties go to the earlier sequence.

The forward pass re-encodes the same data (same specs, ``max_examples``, ``max_length``; no
parse, which changes no token) and runs the encoder on the chosen sequences only. The sequence
numbering is the analysis's: the specs' sequences one after the other, each in file order
(``scores.npz``'s N axis); a sequence whose length differs from ``scores.npz``'s is an error.
Maps are stored as uint8 ``round(255 * alpha)`` (base64), real positions only.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from flax import nnx

from heads_jax import contract
from heads_jax.data.specs import encode_spec

DEFAULT_BATCH = 16
DEFAULT_PER_HEAD = 3
DEFAULT_MAX_TOKENS = 40


@dataclasses.dataclass(frozen=True)
class HeadExamples:
  """The examples of one head: ``roles`` (the view roles), ``assigned`` (whether they are the
  head's assigned roles or its strongest role), and ``picks``: ``(sequence, role, score)`` best
  first, ``sequence`` an index into the N axis of ``scores.npz``."""
  layer: int
  head: int
  roles: tuple[str, ...]
  assigned: bool
  picks: tuple[tuple[int, str, float], ...]


def choose_examples(sieve_bias, roles: Sequence[str], assigned, statistic, lengths, *,
                    per_head: int = DEFAULT_PER_HEAD,
                    max_tokens: int = DEFAULT_MAX_TOKENS) -> list[HeadExamples]:
  """The examples of every head, layer by layer (module docstring).

  Args:
    sieve_bias: float ``[N, L, H, R]`` (NaN where a sieve is empty).
    roles: the R role names.
    assigned: bool ``[L, H, R]``, the run's role decisions.
    statistic: float ``[L, H, R]``, each test's statistic (NaN where untested).
    lengths: int ``[N]``, real positions per sequence.
    per_head: examples per head (at most; fewer when fewer sequences have a score).
    max_tokens: preferred longest sequence.
  """
  sieve_bias = np.asarray(sieve_bias, np.float64)
  n, num_layers, num_heads, num_roles = sieve_bias.shape
  roles = tuple(roles)
  assigned = np.asarray(assigned, bool)
  statistic = np.asarray(statistic, np.float64)
  lengths = np.asarray(lengths, np.int64)
  if len(roles) != num_roles or assigned.shape != (num_layers, num_heads, num_roles) \
      or statistic.shape != assigned.shape or lengths.shape != (n,):
    raise ValueError(f"shapes disagree: sieve_bias {sieve_bias.shape}, roles {len(roles)}, "
                     f"assigned {assigned.shape}, statistic {statistic.shape}, lengths {lengths.shape}")
  if per_head < 1:
    raise ValueError(f"per_head must be at least 1, got {per_head}")
  short = lengths <= max_tokens
  out = []
  for l in range(num_layers):
    for h in range(num_heads):
      own = np.flatnonzero(assigned[l, h])
      is_assigned = own.size > 0
      if not is_assigned:
        stat = statistic[l, h]
        own = np.array([int(np.nanargmax(stat))]) if np.isfinite(stat).any() else np.array([], int)
      queues = []
      for r in own:
        score = sieve_bias[:, l, h, r]
        ok = np.isfinite(score)
        pool = ok & short if (ok & short).any() else ok
        order = np.flatnonzero(pool)
        order = order[np.argsort(-score[order], kind="stable")]
        queues.append([(int(i), roles[r], float(score[i])) for i in order])
      picks, seen = [], set()
      while len(picks) < per_head and any(queues):
        for q in queues:
          while q and q[0][0] in seen:
            q.pop(0)
          if q and len(picks) < per_head:
            pick = q.pop(0)
            seen.add(pick[0])
            picks.append(pick)
      out.append(HeadExamples(l, h, tuple(roles[r] for r in own), is_assigned, tuple(picks)))
  return out


def sequences_needed(examples: list[HeadExamples]) -> dict[int, list[tuple[int, int]]]:
  """``{sequence: [(layer, head), ...]}``: the heads whose map each chosen sequence needs."""
  need: dict[int, list[tuple[int, int]]] = {}
  for e in examples:
    for seq, _, _ in e.picks:
      need.setdefault(seq, []).append((e.layer, e.head))
  return dict(sorted(need.items()))


EXAMPLES_FORMAT = "heads_jax.examples"
EXAMPLES_VERSION = 1
QUANTIZATION = 255


def encode_map(alpha) -> str:
  """A map float ``[n, n]`` (values in [0, 1]) as base64 of uint8 ``round(255 * alpha)``,
  row-major."""
  q = np.clip(np.rint(np.asarray(alpha, np.float64) * QUANTIZATION), 0, QUANTIZATION)
  return base64.b64encode(q.astype(np.uint8).tobytes()).decode("ascii")


def decode_map(text: str, n: int) -> np.ndarray:
  """float32 ``[n, n]`` from `encode_map` (each value within 1/510 of the original)."""
  q = np.frombuffer(base64.b64decode(text), np.uint8)
  if q.size != n * n:
    raise ValueError(f"a map of {q.size} values is not {n} x {n}")
  return (q.astype(np.float32) / QUANTIZATION).reshape(n, n)


def examples_document(examples: list[HeadExamples], sequences: dict[int, dict], *,
                      per_head: int, max_tokens: int, rule: str | None = None) -> dict:
  """The ``examples.json`` document (DESIGN.md section 4) from the chosen examples and the
  model stage's ``{sequence: {"tokens", "segments", "maps"}}``."""
  order = sorted(sequences)
  position = {s: i for i, s in enumerate(order)}
  doc = {"format": EXAMPLES_FORMAT, "version": EXAMPLES_VERSION, "quantization": QUANTIZATION,
         "per_head": int(per_head), "max_tokens": int(max_tokens), "rule": rule,
         "sequences": [{"index": int(s), "tokens": [str(t) for t in sequences[s]["tokens"]],
                        "segments": [int(x) for x in sequences[s]["segments"]]} for s in order],
         "heads": []}
  for e in examples:
    items = []
    for seq, role, score in e.picks:
      alpha = sequences[seq]["maps"][(e.layer, e.head)]
      items.append({"sequence": position[seq], "role": role, "score": float(score),
                    "map": encode_map(alpha)})
    doc["heads"].append({"layer": e.layer, "head": e.head, "roles": list(e.roles),
                         "assigned": bool(e.assigned), "examples": items})
  return doc


@functools.lru_cache(maxsize=16)
def attention_maps_program(graphdef):
  """The head-example pass, jitted once per encoder graph: ``forward(state, ids, mask, types)``
  -> attentions float ``[b, l, h, q, k]`` (explicit attention path)."""
  @jax.jit
  def forward(state, ids, mask, types):
    out = nnx.merge(graphdef, state)(ids, mask, types, return_attentions=True, attention="explicit")
    return out["attentions"]
  return forward


def example_maps(model, tokenizer, specs, need: dict, *, max_length: int,
                 max_examples: int | None = None, lengths=None, batch_size: int = DEFAULT_BATCH,
                 bucket_step: int = 16) -> dict[int, dict]:
  """Tokens, segments and attention maps of the sequences in ``need``.

  The chosen rows are collected while the data streams past, then run through one jitted
  forward pass in chunks of ``batch_size`` rows, all padded to one length (a multiple of
  ``bucket_step``): one compilation whatever the lengths.

  Args:
    model: the encoder, or a task model whose ``.bert`` is used.
    tokenizer: the model's tokenizer (``heads_jax.data.tokenizer``).
    specs: the analysis's data specs, in order.
    need: ``{sequence: [(layer, head), ...]}`` (`sequences_needed`).
    lengths: int ``[N]`` of ``scores.npz``, checked against the re-encoded sequences.

  Returns:
    ``{sequence: {"tokens": [str] * n, "segments": [int] * n, "maps": {(layer, head): float32
    [n, n]}}}`` for every sequence of ``need``.
  """
  rows = _collect_rows(tokenizer, specs, set(int(i) for i in need), max_length=max_length,
                       max_examples=max_examples, batch_size=batch_size, bucket_step=bucket_step)
  encoder = getattr(model, "bert", model)
  graphdef, state = nnx.split(encoder)
  forward = attention_maps_program(graphdef)

  seqs = sorted(rows)
  if not seqs:  # no head has an example (e.g. a single sequence longer than the view's limit)
    return {}
  k = max(len(rows[s]["input_ids"]) for s in seqs)
  k = min(max(k, 1) + (-k) % bucket_step, max(max_length, k))
  out: dict[int, dict] = {}
  for start in range(0, len(seqs), batch_size):
    chunk = seqs[start:start + batch_size]
    arrays = {f: np.zeros((batch_size, k), np.int32) for f in ("input_ids", "attention_mask",
                                                               "token_type_ids")}
    for j, seq in enumerate(chunk):
      n = len(rows[seq]["input_ids"])
      for f in arrays:
        arrays[f][j, :n] = rows[seq][f]
    att = np.asarray(forward(state, arrays["input_ids"], arrays["attention_mask"],
                             arrays["token_type_ids"]))
    for j, seq in enumerate(chunk):
      row = rows[seq]
      n = len(row["input_ids"])
      if lengths is not None and int(lengths[seq]) != n:
        raise ValueError(f"sequence {seq} has {n} positions now and {int(lengths[seq])} in the "
                         "analysis; the data or the tokenizer changed since the analysis pass")
      out[seq] = {"tokens": tokenizer.convert_ids_to_tokens(row["input_ids"].tolist()),
                  "segments": row["token_type_ids"].astype(int).tolist(),
                  "maps": {(l, h): att[j, l, h, :n, :n].astype(np.float32) for l, h in need[seq]}}
  return out


def _collect_rows(tokenizer, specs, remaining: set, *, max_length, max_examples, batch_size,
                  bucket_step) -> dict[int, dict]:
  """The encoded rows (unpadded) of the sequences in ``remaining``, by sequence number."""
  rows: dict[int, dict] = {}
  offset = 0
  for spec in specs:
    if not remaining:
      break
    _, batches, count = encode_spec(spec, tokenizer, max_length=max_length, batch_size=batch_size,
                                    max_examples=max_examples, syntax=False,
                                    bucket_step=bucket_step)
    mine = {i for i in remaining if offset <= i < offset + count}
    if mine:
      for indices, batch in batches:
        for j, i in enumerate(indices):
          if i >= 0 and int(i) + offset in mine:
            n = int(batch["attention_mask"][j].sum())
            rows[int(i) + offset] = {f: batch[f][j, :n].copy() for f in
                                     ("input_ids", "attention_mask", "token_type_ids")}
            mine.discard(int(i) + offset)
            remaining.discard(int(i) + offset)
        if not mine:
          break
    offset += count
  if remaining:
    raise ValueError(f"sequences {sorted(remaining)[:5]} are not in the data ({offset} sequences); "
                     "the data changed since the analysis pass")
  return rows


def _choose_from_files(out_dir, per_head: int, max_tokens: int):
  scores = contract.read_scores(out_dir)
  loaded = contract.load_tests(out_dir)
  tests, settings = loaded.table, loaded.settings
  L, H = scores.num_layers, scores.num_heads
  index = {r: i for i, r in enumerate(scores.roles)}
  assigned = np.zeros((L, H, len(index)), bool)
  statistic = np.full((L, H, len(index)), np.nan)
  rows = tests[tests["role"].isin(index)]
  at = (rows["layer"].to_numpy(int), rows["head"].to_numpy(int),
        rows["role"].map(index).to_numpy(int))
  assigned[at] = rows["assigned"].to_numpy(bool)
  statistic[at] = rows["statistic"].to_numpy(float)
  lengths = scores.lengths if scores.lengths is not None else np.zeros(len(scores.sieve_bias), int)
  examples = choose_examples(scores.sieve_bias, scores.roles, assigned, statistic, lengths,
                             per_head=per_head, max_tokens=max_tokens)
  return examples, scores, settings


def _same_choice(doc: dict | None, examples: list[HeadExamples], per_head: int, max_tokens: int) -> bool:
  """Whether ``doc`` (an examples.json) holds exactly these picks."""
  if not doc or doc.get("per_head") != per_head or doc.get("max_tokens") != max_tokens \
      or len(doc.get("heads", [])) != len(examples):
    return False
  index = [s["index"] for s in doc["sequences"]]
  for e, h in zip(examples, doc["heads"]):
    stored = [(index[x["sequence"]], x["role"]) for x in h["examples"]]
    if (h["layer"], h["head"]) != (e.layer, e.head) or stored != [(p[0], p[1]) for p in e.picks]:
      return False
  return True


def write_head_examples(out_dir, model, tokenizer, specs, *, max_length: int,
                        max_examples: int | None = None, per_head: int = DEFAULT_PER_HEAD,
                        max_tokens: int = DEFAULT_MAX_TOKENS, bucket_step: int = 16,
                        batch_size: int = DEFAULT_BATCH) -> tuple[Path, bool]:
  """Chooses the examples from ``out_dir``'s scores.npz and tests.csv, computes their maps and
  writes ``out_dir/examples.json`` (module docstring). An examples.json that already holds the
  same choice (a re-run that only changed host settings) is kept without a forward pass.

  ``model`` may be a zero-argument callable returning ``(model, tokenizer)`` (then
  ``tokenizer`` is ignored): it is called only when maps must be computed.
  Returns ``(path, computed)``.
  """
  examples, scores, settings = _choose_from_files(out_dir, per_head, max_tokens)
  path = Path(out_dir) / contract.EXAMPLES_JSON
  if _same_choice(contract.read_examples(out_dir), examples, per_head, max_tokens):
    return path, False
  if callable(model) and not hasattr(model, "config"):
    model, tokenizer = model()
  need = sequences_needed(examples)
  sequences = example_maps(model, tokenizer, specs, need, max_length=max_length,
                           max_examples=max_examples, lengths=scores.lengths,
                           batch_size=batch_size, bucket_step=bucket_step)
  doc = examples_document(examples, sequences, per_head=per_head, max_tokens=max_tokens,
                          rule=settings.get("rule"))
  return contract.write_examples(doc, out_dir), True
