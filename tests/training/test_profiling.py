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
  cat_of = {n: c for n, c, _ in p.top}
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
