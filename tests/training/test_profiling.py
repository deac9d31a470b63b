"""bench/profiling.py (issue 39): the interval sharing against hand-derived figures, the HLO
parser on a compiled module, and a real CPU trace of a tiny program whose ops are known: every
event found in its HLO, each known op in its category and phase, and the categories (and the
phases) summing to the span."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import profiling  # noqa: E402


def test_overlapping_events_share_their_time_and_sum_to_the_span():
  # two steps: A [0, 10] and B [5, 15] overlap on [5, 10]; C [20, 30] after a 5 ns gap
  ev = [profiling.Event("gemm_a", "", "", 0, 10), profiling.Event("loop_b_fusion", "", "", 5, 15),
        profiling.Event("copy_c", "", "", 20, 30)]
  p = profiling.summarize(ev, steps=2)
  per = 1e-6 / 2                                      # ns -> ms, per step
  assert p.categories["GEMM"] == pytest.approx(7.5 * per)        # 5 alone + 5 shared by 2
  assert p.categories["elementwise fusions"] == pytest.approx(7.5 * per)
  assert p.categories["copies/transposes"] == pytest.approx(10 * per)
  assert p.busy_ms == pytest.approx(25 * per) and p.idle_ms == pytest.approx(5 * per)
  assert p.span_ms == pytest.approx(30 * per)
  assert sum(p.categories.values()) == pytest.approx(p.span_ms)
  assert sum(p.phases.values()) == pytest.approx(p.span_ms)
  assert p.top[0][2] == pytest.approx(10 * per) and p.top[0][0] == "copy_c"
  assert p.top[0][3] == 0.5                          # one call in two steps
  text = p.table()
  assert "GEMM" in text and "idle" in text and "span" in text


def test_first_matching_category_wins_and_the_rest_is_other():
  ev = [profiling.Event("heads_jax_statistics_kernel", "", "", 0, 4),
        profiling.Event("nvjet_gemm", "", "", 4, 6), profiling.Event("mystery", "", "", 6, 7)]
  cats = [("statistics", "heads_jax_statistics"), ("GEMMs", "gemm|nvjet")]
  p = profiling.summarize(ev, steps=1, categories=cats)
  assert list(p.categories) == ["statistics", "GEMMs", "other", "idle"]
  assert [p.categories[k] * 1e6 for k in ("statistics", "GEMMs", "other")] == \
      pytest.approx([4, 2, 1])


def _program():
  """A GEMM, dropout-like random bits, and an update under the optimizer's scope, with a
  gradient (forward and backward ops)."""
  def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w))

  def f(w, x, key):
    value, g = jax.value_and_grad(loss)(w, x)
    bits = jax.random.bits(key, (256, 256))
    with jax.named_scope("optimizer"):
      w = w - 0.1 * g
    return value, bits, w

  args = (jnp.ones((128, 128)) * 0.01, jnp.ones((256, 128)), jax.random.key(0))
  return jax.jit(f).lower(*args).compile(), args


def test_hlo_parser_reads_the_compiled_module():
  compiled, _ = _program()
  instrs, comps, module = profiling.parse_hlo(compiled.as_text())
  assert module.startswith("jit_f")
  dots = [n for n, i in instrs.items() if i.opcode == "dot"]
  assert len(dots) >= 2                         # the forward's x @ w, the backward's x.T @ g
  index = profiling.HloIndex(compiled.as_text())
  phases = {index.describe(n)[1] for n in dots}
  assert phases == {"forward", "backward"}
  opt = [n for n, i in instrs.items() if any("/optimizer/" in o for o in i.op_names)]
  assert opt and all("scope:optimizer" in index.describe(n)[0] for n in opt)
  # a GPU kernel without an hlo_op stat is found by its name ("." and "-" made "_")
  dotted = next(n for n in instrs if "." in n and index.describe(n)[0])
  assert index.describe(dotted.replace(".", "_").replace("-", "_")) == index.describe(dotted)
  assert index.describe("no_such_kernel") == ("", "unknown")


def test_a_cpu_trace_of_a_known_program():
  compiled, args = _program()
  text = compiled.as_text()
  plane, events, wall = profiling.trace_events(lambda: compiled(*args), steps=2,
                                               module=profiling.parse_hlo(text)[2])
  assert plane == "/host:CPU" and wall > 0
  index = profiling.HloIndex(text)
  assert all(e.hlo_op in index.instrs for e in events)       # every op event is in the HLO
  p = profiling.summarize(events, steps=2, plane=plane, hlo_text=text)
  for cat in ("GEMM", "optimizer", "dropout RNG"):
    assert p.categories[cat] > 0, (cat, p.table())
  assert p.phases["forward"] > 0 and p.phases["backward"] > 0 and p.phases["optimizer"] > 0
  assert sum(p.categories.values()) == pytest.approx(p.span_ms, rel=1e-9)
  assert sum(p.phases.values()) == pytest.approx(p.span_ms, rel=1e-9)
  # each event's category follows from its HLO: the dots are GEMMs, the optimizer's ops
  # (no dot) the optimizer's, the rotations the RNG's
  cat_of = {n: c for n, c, *_ in p.top}
  for name, cat in cat_of.items():
    fields, _ = index.describe(name)
    if "opc:dot" in fields:
      assert cat == "GEMM", (name, fields)
    elif "scope:optimizer" in fields:
      assert cat == "optimizer", (name, fields)
    elif "opc:xor" in fields:
      assert cat == "dropout RNG", (name, fields)


def test_profile_categories_is_the_short_form():
  compiled, args = _program()
  out = profiling.profile_categories(compiled, args, steps=1,
                                     categories=[("GEMMs", "opc:dot"), ("rest", ".")])
  assert list(out) == ["GEMMs", "rest", "other", "idle"]
  assert out["GEMMs"] > 0 and out["rest"] > 0 and out["other"] == 0
  with pytest.raises(ValueError, match="steps"):
    profiling.profile(lambda: None, steps=0)


def test_kernels_in_a_cuda_graph_are_named_and_phased_by_their_kernel():
  """Inside a command buffer every kernel's hlo_op is the buffer's thunk: the fusions are found
  by kernel name ("." -> "_"), a library GEMM keeps its kernel name and takes the phase of the
  kernel before it."""
  compiled, _ = _program()
  text = compiled.as_text()
  index = profiling.HloIndex(text)
  fwd = next(n for n, i in index.instrs.items() if "." in n and i.opcode == "fusion"
             and index.describe(n)[1] == "forward")
  bwd = next(n for n, i in index.instrs.items() if i.opcode not in ("parameter", "constant")
             and index.describe(n)[1] == "backward")
  k = lambda n: n.replace(".", "_").replace("-", "_")
  ev = [profiling.Event(k(fwd), "command_buffer_1", "", 0, 2),
        profiling.Event("nvjet_tst_128x64_gemm", "command_buffer_1", "", 2, 6),
        profiling.Event(k(bwd), "command_buffer_1", "", 6, 7),
        profiling.Event("sm90_xmma_gemm_bf16", "command_buffer_1", "", 7, 10)]
  p = profiling.summarize(ev, steps=1, hlo_text=text)
  names = {n for n, *_ in p.top}
  assert {fwd, bwd, "nvjet_tst_128x64_gemm", "sm90_xmma_gemm_bf16"} == names
  assert "command_buffer_1" not in names
  assert p.phases["forward"] * 1e6 == pytest.approx(6)      # the fusion + the GEMM after it
  assert p.phases["backward"] * 1e6 == pytest.approx(4)
  assert p.phases["unknown"] == 0 and p.categories["GEMM"] * 1e6 == pytest.approx(7)
  assert p.labels[fwd].startswith("forward: k:") and "opc:" in p.labels[fwd]
  # a library kernel after an optimizer kernel takes the model's phase before it, not the
  # optimizer's (the update has no GEMMs; XLA interleaves it with the backward)
  opt = next(n for n, i in index.instrs.items() if i.opcode not in ("parameter", "constant")
             and index.describe(n)[1] == "optimizer")
  ev2 = ev[:3] + [profiling.Event(k(opt), "command_buffer_1", "", 7, 8),
                  profiling.Event("sm90_xmma_gemm_bf16", "command_buffer_1", "", 8, 10)]
  p2 = profiling.summarize(ev2, steps=1, hlo_text=text)
  assert p2.phases["optimizer"] * 1e6 == pytest.approx(1)
  assert p2.phases["backward"] * 1e6 == pytest.approx(3)
