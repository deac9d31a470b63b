"""Where a program's device time goes: a ``jax.profiler`` trace of N runs summed per category.

    prof = profiling.profile(run, steps=10, hlo_text=compiled.as_text())
    print(prof.table())                  # ms per step by category, by phase, the top kernels
    prof.as_dict()                       # the same as JSON-ready numbers
    profiling.profile_categories(compiled, (x, y), steps=10, categories=CATS)  # {category: ms/step}

``run()`` is called ``steps`` times under ``jax.profiler.trace`` (dispatched back to back, as a
training loop does; blocked once at the end), after one untraced warm-up call. The trace's
``.xplane.pb`` is read with ``jax.profiler.ProfileData.from_file``:

* on a GPU/TPU the ``/device:GPU:0`` (``/device:TPU:0``) plane: every kernel and copy on its
  stream lines (an event's ``hlo_op`` / ``hlo_module`` stats name the XLA instruction);
* on the CPU the ``/host:CPU`` plane's XLA op events (those with an ``hlo_op`` stat: the
  thunks of the compiled program on XLA's threads).

Events of other programs (``hlo_module`` not the profiled one's) are left out when the module is
known (``hlo_text``), and kept when no event carries it.

Each event gets a label, the text the category patterns search (first match wins, the rest is
``other``)::

    k:<kernel name> op:<instruction> opc:<opcode> ... tgt:<custom-call target> scope:<s> ...
    prim:<p> ...

The instruction is the event's ``hlo_op`` when the compiled HLO (``hlo_text``, e.g.
``compiled.as_text()``) has it, else the one the kernel is named after (XLA names a fusion's
kernel after the fusion, "." and "-" made "_"): inside a CUDA graph (XLA's command buffers, the
default on GPUs) every kernel's ``hlo_op`` is the command buffer's thunk (``command_buffer_1``),
not an instruction. Library kernels (cuBLAS, cuDNN, Pallas calls) have no instruction of their
name and keep their kernel name. The ``opc:``/``tgt:``/``scope:``/``prim:`` fields: the
instruction with every instruction of the computations it calls (a fusion's body). ``scope:`` are the
``jax.named_scope`` names in the instructions' ``op_name`` metadata (``jit(f)/transpose(jvp(
optimizer))/mul`` gives scope ``optimizer`` and primitive ``mul``), ``prim:`` the JAX primitives.
The same metadata gives the phase: ``optimizer`` (a scope ``optimizer``, which
``training.steps.make_train_step`` puts around the update), ``backward`` (a ``transpose(...)``
op name), ``forward`` (any other ``jvp``/``jit`` op name); a kernel without an instruction (a
cuBLAS GEMM in a CUDA graph) takes the phase of the forward or backward kernel before it in time
(an inference: forward GEMMs run between forward fusions, backward ones between backward
fusions; the optimizer has none), and
``unknown`` is left only where no kernel has a phase (no HLO given).

Attribution: where events overlap (several streams or threads), each elementary interval is
shared equally among the events running in it, so the categories sum to the busy time (the union
of the events) exactly, and ``idle`` = span - busy, where the span runs from the first event's
start to the last one's end: the categories plus ``idle`` sum to the span. All figures are ms per
step (divided by ``steps``). ``wall_ms`` is the host's ``perf_counter`` time per step around the
traced loop (it includes the profiler's own overhead and the first dispatch).
"""

from __future__ import annotations

import dataclasses
import glob
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

# (category, regex searched in the event's label); first match wins, the rest is "other".
DEFAULT_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention kernel", r"k:\S*(flash|fmha|sdpa|attention)|tgt:\S*(fmha|triton)"
                         r"|scope:\S*attention_kernel"),
    ("GEMM", r"k:\S*(gemm|cublas|cutlass|matmul|xmma|nvjet|cudnn)|tgt:\S*(cublas|gemm|cudnn)"
             r"|opc:(dot|convolution)\b"),
    ("optimizer", r"scope:(optimizer|lamb)\b"),
    # threefry is lowered to XLA integer ops (op names without "threefry"): its rotations
    # (shifts, xor) are the mark; rbg is one rng-bit-generator
    ("dropout RNG", r"opc:(rng-bit-generator|xor|shift-left|shift-right-logical)\b"
                    r"|prim:(threefry2x32|random_bits|iota_2x32_shape)\b|k:\S*(threefry|philox)"),
    ("copies/transposes", r"k:\S*(copy|transpose|memcpy|memset|Memcpy|Memset)"
                          r"|^k:\S+ op:(copy|transpose)[\w.\-]*( |$)"),
    ("reductions (LayerNorm, softmax, loss)", r"opc:(reduce|reduce-window)\b|k:\S*reduce"),
    ("elementwise fusions", r"opc:fusion\b|k:\S*(fusion|loop_)"),
)

_DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Framework", "TensorFlow", "Source code",
                  "XLA TraceMe", "Launch Stats", "SparseCore")


class ProfileUnavailable(RuntimeError):
  """The trace has no events to sum (no device plane, no XLA op events): one line saying why."""


# ------------------------------------------------------------------------------------------------
# The compiled HLO: instruction name -> what it is

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_OPCODE = re.compile(r"(?<![\w\-.%$])([a-z][a-z0-9\-]*)\(")
# a fusion's or custom call's body (not a while loop's or a conditional's: those are events of
# their own on the CPU, and containers are not counted: ``_CONTAINERS``)
_CALLS = re.compile(r"\b(?:calls|to_apply)=\{?([^}\s,]+"
                    r"(?:,\s*%?[\w.\-]+)*)\}?")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OPNAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass
class _Instr:
  opcode: str
  target: str
  op_names: list[str]
  calls: list[str]


def parse_hlo(text: str) -> tuple[dict[str, _Instr], dict[str, list[str]], str]:
  """``(instructions by name, instruction names by computation, module name)`` of an HLO
  module's text (``compiled.as_text()``)."""
  instrs: dict[str, _Instr] = {}
  comps: dict[str, list[str]] = defaultdict(list)
  module, comp = "", None
  for line in text.splitlines():
    if line.startswith("HloModule "):
      module = line.split()[1].rstrip(",")
      continue
    m = _COMP.match(line)
    if m and "=" not in line.split("(", 1)[0]:
      comp = m.group(1)
      continue
    m = _INSTR.match(line)
    if not m or comp is None:
      continue
    name, rest = m.groups()
    body = rest.split(", metadata=", 1)[0]
    op = _OPCODE.search(body)
    calls = []
    for c in _CALLS.finditer(body):
      calls += [x.strip().lstrip("%") for x in c.group(1).split(",") if x.strip()]
    t = _TARGET.search(body)
    instrs[name] = _Instr(op.group(1) if op else "", t.group(1) if t else "",
                          _OPNAME.findall(rest), calls)
    comps[comp].append(name)
  return instrs, dict(comps), module


def _split_op_name(op_name: str) -> tuple[set[str], str]:
  """``("jit(f)/transpose(jvp(optimizer))/mul")`` -> ``({"optimizer"}, "mul")``: the named
  scopes (inside the transformation wrappers) and the primitive."""
  parts = op_name.split("/")
  scopes: set[str] = set()
  for p in parts[1:-1]:
    inner = re.sub(r"^(?:[\w\-]+\()+", "", p).rstrip(")")
    if inner and not inner.startswith("jit("):
      scopes.add(inner)
  return scopes, parts[-1] if len(parts) > 1 else ""


_HEAVY = ("dot", "convolution", "custom-call")
# control flow whose body's ops are events of their own (the CPU's thunks): left out of the sums
_CONTAINERS = ("while", "conditional", "call")


class HloIndex:
  """What each XLA instruction of one compiled module is: opcodes, custom-call targets, scopes,
  primitives and phase of the instruction and of everything it calls (memoised)."""

  def __init__(self, text: str | None):
    self.instrs, self.comps, self.module = parse_hlo(text) if text else ({}, {}, "")
    self._memo: dict[str, tuple[str, str]] = {}
    # CUDA kernel names cannot hold "." or "-": XLA's kernel for fusion "loop_add_fusion.2" is
    # "loop_add_fusion_2" (what a kernel event without an hlo_op stat is found by)
    self._alias = {re.sub(r"[.\-]", "_", n): n for n in self.instrs}

  def resolve(self, name: str) -> str:
    """The instruction named ``name`` or whose kernel is named so ("" if none)."""
    return name if name in self.instrs else self._alias.get(name, "")

  def opcode(self, name: str) -> str:
    ins = self.instrs.get(self.resolve(name))
    return ins.opcode if ins else ""

  def describe(self, name: str) -> tuple[str, str]:
    """``(label fields, phase)`` of instruction ``name`` (``("", "unknown")`` if not in it)."""
    name = self.resolve(name)
    if not name:
      return "", "unknown"
    if name in self._memo:
      return self._memo[name]
    opcodes, targets, scopes, prims, names, heavy = [], [], set(), [], [], []
    seen, todo = set(), [name]
    while todo:
      n = todo.pop()
      if n in seen or n not in self.instrs:
        continue
      seen.add(n)
      ins = self.instrs[n]
      if ins.opcode and ins.opcode not in ("parameter", "constant", "tuple",
                                           "get-tuple-element", "bitcast"):
        opcodes.append(ins.opcode)
      if ins.target:
        targets.append(ins.target)
      for on in ins.op_names:
        names.append(on)
        if ins.opcode in _HEAVY:
          heavy.append(on)
        for part in on.split(";"):
          s, p = _split_op_name(part)
          scopes |= s
          if p:
            prims.append(p)
      for c in ins.calls:
        todo.extend(self.comps.get(c, ()))
    # the phase of a GEMM (custom call) with its epilogue is the GEMM's; otherwise any op of
    # the optimizer's scope makes it the optimizer's, any transposed op the backward's
    joined = ";".join(heavy or names)
    if re.search(r"[/(](optimizer|lamb)[/)]", joined):
      phase = "optimizer"
    elif "transpose(" in joined:
      phase = "backward"
    elif joined:
      phase = "forward"
    else:
      phase = "unknown"
    fields = " ".join([f"opc:{o}" for o in dict.fromkeys(opcodes)]
                      + [f"tgt:{t}" for t in dict.fromkeys(targets)]
                      + [f"scope:{s}" for s in sorted(scopes)]
                      + [f"prim:{p}" for p in dict.fromkeys(prims)])
    self._memo[name] = (fields, phase)
    return self._memo[name]


# ------------------------------------------------------------------------------------------------
# The trace: events of one plane

@dataclasses.dataclass(frozen=True)
class Event:
  name: str          # the kernel's (GPU) or the thunk's (CPU) name
  hlo_op: str        # the XLA instruction ("" if the event carries none)
  module: str        # the hlo_module stat ("" if none)
  start_ns: float
  end_ns: float


def _stats(obj) -> dict:
  return {k: v for k, v in obj.stats if k is not None}


def read_events(xplane_path: str, module: str = "",
                need_device: bool = False) -> tuple[str, list[Event]]:
  """``(plane name, events)`` of a trace file: the first accelerator plane's stream events, or
  on the CPU the XLA op events (with an ``hlo_op`` stat). Events of another module than
  ``module`` are dropped when some event carries ``module``. ``need_device``: a trace without
  an accelerator plane (no CUPTI on a GPU host) raises instead of reading the host's ops."""
  from jax.profiler import ProfileData
  data = ProfileData.from_file(xplane_path)
  planes = list(data.planes)
  device = sorted((p for p in planes if re.match(r"/device:(GPU|TPU):\d+$", p.name)),
                  key=lambda p: p.name)
  events: list[Event] = []
  if device:
    plane = device[0]
    lines = [ln for ln in plane.lines if not ln.name.startswith(_DERIVED_LINES)]
    streams = [ln for ln in lines if ln.name.startswith("Stream")]
    for ln in streams or lines:
      for e in ln.events:
        st = _stats(e)
        events.append(Event(e.name, str(st.get("hlo_op", "")), str(st.get("hlo_module", "")),
                            float(e.start_ns), float(e.start_ns + e.duration_ns)))
  elif need_device:
    raise ProfileUnavailable(f"no /device:GPU or /device:TPU plane in the trace (planes: "
                             f"{[p.name for p in planes]}; on a GPU the profiler needs CUPTI)")
  else:
    plane = next((p for p in planes if p.name == "/host:CPU"), None)
    if plane is None:
      raise ProfileUnavailable(f"no device or /host:CPU plane in {xplane_path} "
                               f"(planes: {[p.name for p in planes]})")
    for ln in plane.lines:
      for e in ln.events:
        st = _stats(e)
        if "hlo_op" in st:
          events.append(Event(e.name, str(st["hlo_op"]), str(st.get("hlo_module", "")),
                              float(e.start_ns), float(e.start_ns + e.duration_ns)))
  if module and any(e.module == module for e in events):
    events = [e for e in events if e.module in (module, "")]
  if not events:
    raise ProfileUnavailable(f"the trace's {plane.name} plane has no kernel/op events")
  return plane.name, events


# ------------------------------------------------------------------------------------------------
# The summary

@dataclasses.dataclass
class Profile:
  """ms per step: ``categories`` (with ``idle``) and ``phases`` (with ``idle``) each sum to
  ``span_ms``; ``top``: the kernels that took most, ``(name, category, ms per step, calls per
  step)``; ``labels``: what each of them is (its phase and label: the operations it fuses)."""
  steps: int
  plane: str
  span_ms: float
  busy_ms: float
  idle_ms: float
  wall_ms: float
  categories: dict[str, float]
  phases: dict[str, float]
  top: list[tuple[str, str, float, float]]
  events: int
  labels: dict[str, str] = dataclasses.field(default_factory=dict)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  def table(self, top: int = 10) -> str:
    """A printable table: categories, phases, the ``top`` kernels."""
    def block(title, items):
      w = max([len(k) for k, _ in items] + [len(title)])
      out = [f"  {title:<{w}}  ms/step   share"]
      out += [f"  {k:<{w}}  {v:8.3f}  {100 * v / self.span_ms if self.span_ms else 0:5.1f}%"
              for k, v in items]
      return out
    head = (f"profile: {self.steps} steps on {self.plane}, {self.events} events; span "
            f"{self.span_ms:.3f} ms/step (busy {self.busy_ms:.3f}, idle {self.idle_ms:.3f}), "
            f"host wall {self.wall_ms:.3f} ms/step")
    lines = [head]
    lines += block("category", list(self.categories.items()))
    lines += block("phase", list(self.phases.items()))
    lines += block("kernel (category) x calls a step",
                   [(f"{n[:70]} ({c}) x{k:g}", v) for n, c, v, k in self.top[:top]])
    return "\n".join(lines)


def _share(intervals: list[tuple[float, float, Any]]) -> tuple[dict, float]:
  """``({key: time}, busy)``: each elementary interval split equally among the intervals
  ``(start, end, key)`` covering it; ``busy`` is their union's length."""
  points = []
  for i, (s, e, _) in enumerate(intervals):
    if e > s:
      points.append((s, 1, i))
      points.append((e, 0, i))
  points.sort()
  active: set[int] = set()
  out: dict = defaultdict(float)
  busy, last = 0.0, None
  for t, kind, i in points:
    if active and last is not None and t > last:
      dt = t - last
      busy += dt
      for j in active:
        out[intervals[j][2]] += dt / len(active)
    last = t
    if kind:
      active.add(i)
    else:
      active.discard(i)
  return dict(out), busy


def summarize(events: Sequence[Event], *, steps: int, plane: str = "",
              hlo_text: str | None = None, categories: Sequence[tuple[str, str]] | None = None,
              wall_s: float = 0.0, top: int = 15) -> Profile:
  """The ``Profile`` of ``events`` (``steps`` runs of one program; module docstring)."""
  cats = [(c, re.compile(rx)) for c, rx in (DEFAULT_CATEGORIES if categories is None
                                             else categories)]
  index = HloIndex(hlo_text)
  # the instruction an event ran: its hlo_op, or (inside a CUDA graph, whose kernels all carry
  # the command buffer's name, e.g. "command_buffer_1") the one its kernel is named after;
  # library kernels (cuBLAS, cuDNN, Pallas calls) keep their kernel name
  named = [(e, index.resolve(e.hlo_op) or index.resolve(e.name) or e.name) for e in events]
  named = [(e, n) for e, n in named if index.opcode(n) not in _CONTAINERS]
  if not named:
    raise ProfileUnavailable("no kernel/op events besides control flow")
  named.sort(key=lambda x: x[0].start_ns)
  described = [(e, n) + index.describe(n) for e, n in named]
  phases = _fill_phases([ph for _, _, _, ph in described])
  keyed, calls, labels = [], defaultdict(int), {}
  for (e, name, fields, _), phase in zip(described, phases):
    label = f"k:{e.name} op:{name} {fields}".strip()
    cat = next((c for c, rx in cats if rx.search(label)), "other")
    keyed.append((e.start_ns, e.end_ns, (cat, phase, name)))
    calls[(name, cat)] += 1
    labels.setdefault(name, f"{phase}: {label}")
  events = [e for e, _ in named]
  shares, busy = _share(keyed)
  span = max(e.end_ns for e in events) - min(e.start_ns for e in events)
  per = 1e-6 / steps
  by_cat: dict[str, float] = {c: 0.0 for c, _ in cats}
  by_cat["other"] = 0.0
  by_phase: dict[str, float] = {p: 0.0 for p in ("forward", "backward", "optimizer", "unknown")}
  kernels: dict[tuple[str, str], float] = defaultdict(float)
  for (cat, phase, name), t in shares.items():
    by_cat[cat] += t * per
    by_phase[phase] += t * per
    kernels[(name, cat)] += t * per
  idle = (span - busy) * per
  by_cat["idle"] = idle
  by_phase["idle"] = idle
  ranked = sorted(((n, c, v, calls[(n, c)] / steps) for (n, c), v in kernels.items()),
                  key=lambda x: -x[2])
  return Profile(steps=steps, plane=plane, span_ms=span * per, busy_ms=busy * per, idle_ms=idle,
                 wall_ms=1e3 * wall_s / steps, categories=by_cat, phases=by_phase,
                 top=ranked[:top], events=len(events),
                 labels={n: labels[n][:600] for n, *_ in ranked[:top]})


def _fill_phases(phases: list[str]) -> list[str]:
  """Phases in time order with each ``unknown`` (a library kernel without an HLO instruction:
  a cuBLAS GEMM inside a CUDA graph) given the phase of the model kernel (forward or backward)
  before it: never ``optimizer``, whose update has no library kernels although XLA interleaves
  its kernels with the backward's (the first ones: of the first known after them). All unknown
  stay unknown."""
  out, last = list(phases), None
  for i, ph in enumerate(out):
    if ph == "unknown":
      if last is not None:
        out[i] = last
    elif ph in ("forward", "backward"):
      last = ph
  first = next((ph for ph in out if ph in ("forward", "backward")), None)
  if first is not None:
    for i, ph in enumerate(out):
      if ph != "unknown":
        break
      out[i] = first
  return out


def trace_events(run: Callable[[], Any], steps: int, module: str = "",
                 warmup: int = 1) -> tuple[str, list[Event], float]:
  """``(plane, events, wall seconds)`` of ``steps`` calls of ``run`` under the profiler."""
  import jax
  out = None
  for _ in range(warmup):
    out = run()
  jax.block_until_ready(out)
  with tempfile.TemporaryDirectory(prefix="heads_jax_profile_") as d:
    with jax.profiler.trace(d):
      t = time.perf_counter()
      for _ in range(steps):
        out = run()
      jax.block_until_ready(out)
      wall = time.perf_counter() - t
    found = sorted(glob.glob(str(Path(d) / "**" / "*.xplane.pb"), recursive=True))
    if not found:
      raise ProfileUnavailable(f"jax.profiler.trace wrote no .xplane.pb under {d}")
    plane, events = read_events(found[-1], module,
                                need_device=jax.devices()[0].platform != "cpu")
  return plane, events, wall


def profile(run: Callable[[], Any], *, steps: int = 10, hlo_text: str | None = None,
            categories: Sequence[tuple[str, str]] | None = None, warmup: int = 1) -> Profile:
  """Traces ``steps`` calls of ``run()`` (after ``warmup`` untraced ones) and sums the device
  time per category and phase (module docstring). ``hlo_text``: the compiled module's text
  (``compiled.as_text()``) for the HLO fields of the labels and the phases."""
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  module = parse_hlo(hlo_text)[2] if hlo_text else ""
  plane, events, wall = trace_events(run, steps, module, warmup)
  return summarize(events, steps=steps, plane=plane, hlo_text=hlo_text, categories=categories,
                   wall_s=wall)


def profile_categories(fn: Callable, args: Sequence = (), *, steps: int = 10,
                       categories: Sequence[tuple[str, str]] | None = None) -> dict[str, float]:
  """``{category: ms per step}`` (with ``idle``) of ``fn(*args)`` run ``steps`` times; ``fn`` a
  compiled program (``jax.jit(f).lower(...).compile()``: its HLO labels the events) or any
  callable. ``categories``: ``[(name, regex)]``, first match wins, the rest ``other``."""
  text = None
  as_text = getattr(fn, "as_text", None)
  if callable(as_text):
    try:
      text = as_text()
    except Exception:  # noqa: BLE001  (a program without text is profiled by kernel names)
      text = None
  return profile(lambda: fn(*args), steps=steps, hlo_text=text,
                 categories=categories).categories
