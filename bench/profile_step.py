"""Where a train step's time goes, from a JAX profiler trace of a few steps (bench/run.py --profile DIR).

    with Trace(trace_dir) as t:                          # jax.profiler.trace, and the wall time inside it
        ... run n steps, block on the last ...
    b = breakdown(t.xplane_path(), compiled.as_text(), steps=n, wall_s=t.wall_s)
    print(format_breakdown(b))

Each op the trace shows running -- an event with an `hlo_op` stat (XLA:CPU's thunks, GPU kernels), or on a
device's "XLA Ops" line its name -- is looked up in the compiled step's HLO text and put in the first category
that fits it:

  optimizer              its source stack passes through optax (the AdamW update) or flaxlm/training/divergence.py
  LM head and loss       ... through flaxlm/objectives/lm_loss.py (the head's matmul, log-softmax, cross-entropy)
  attention              ... through flaxlm's attention() or splash (scores, softmax, weighted sum: cuDNN's fused
                         kernel or XLA's ops), or a custom call whose target names fmha / flash / attention
  matmuls                a dot or convolution, a fusion that holds one, a gemm / matmul custom call (projections, MLP)
  elementwise and other  every other op of the step (norms, activations, dropout masks, residual adds, copies)
  other programs         ops of other XLA programs run in the traced steps (jax.random.fold_in of the key), copies
  host (device idle)     the traced steps' wall time in which no op ran: the host's dispatch and batch preparation
                         that the device waited for, launch gaps

Backward ops keep their forward op's source stack, so each category holds its forward and backward work. An
op the HLO does not name (a kernel without an `hlo_op`, e.g. one run inside a CUDA graph) goes by its kernel
name: gemm / cutlass / nvjet / xmma -> matmuls, fmha / flash -> attention, else elementwise and other. Where ops
ran at once (XLA:CPU runs independent thunks on several threads), their times are scaled down to the time in
which any op ran, so that the categories and the host's share add up to the wall time.
"""
import collections
import glob
import os
import re
import time

from bench.hlo_dots import parse_computations

CATEGORIES = ("attention", "matmuls", "LM head and loss", "optimizer", "elementwise and other", "other programs",
              "host (device idle)")

_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SOURCE_FILE = re.compile(r'source_file="([^"]*)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FIELDS = re.compile(r"(\w+)=(\d+)")

# (category, pattern) in order; the source patterns are searched in "file:function" lines of the op's stack.
_SOURCE_RULES = (("optimizer", re.compile(r"/optax/|flaxlm/training/divergence\.py")),
                 ("LM head and loss", re.compile(r"flaxlm/objectives/lm_loss\.py")),
                 ("attention", re.compile(r"flaxlm/models/layers\.py:(attention|_dropout_attention)\b|"
                                          r"flaxlm/models/splash\.py")))
_ATTENTION_TARGET = re.compile(r"fmha|flash|attention", re.I)
_MATMUL_TARGET = re.compile(r"gemm|matmul|cublas|dot", re.I)
_MATMUL_KERNEL = re.compile(r"gemm|cutlass|nvjet|xmma|gmma|cublas|matmul", re.I)
_COPY_KERNEL = re.compile(r"memcpy|memset", re.I)
_CONTAINERS = ("while", "conditional", "call")


def _table(hlo_text, name):
    """{id: rest of line} of one of the HLO text's numbered tables (FileNames, StackFrames, ...)."""
    m = re.search(r"^%s\n(.*?)(?:\n\n|\Z)" % name, hlo_text, re.S | re.M)
    rows = {}
    for line in (m.group(1).splitlines() if m else ()):
        number, _, rest = line.partition(" ")
        if number.isdigit():
            rows[int(number)] = rest.strip()
    return rows


def source_stacks(hlo_text):
    """{stack_frame_id: ["file:function", ...] innermost first} from the HLO text's StackFrames tables.

    The printed parent_frame_id of jaxlib 0.10 is one more than the parent's printed id (0: none), which shows
    as frames that name themselves as their parent; a printer without that offset names none."""
    files = {i: v.strip('"') for i, v in _table(hlo_text, "FileNames").items()}
    functions = {i: v.strip('"') for i, v in _table(hlo_text, "FunctionNames").items()}
    locations = {}
    for i, v in _table(hlo_text, "FileLocations").items():
        f = {k: int(x) for k, x in _FIELDS.findall(v)}
        locations[i] = f"{files.get(f.get('file_name_id'), '?')}:{functions.get(f.get('function_name_id'), '?')}"
    frames = {i: {k: int(x) for k, x in _FIELDS.findall(v)} for i, v in _table(hlo_text, "StackFrames").items()}
    offset = 1 if any(f.get("parent_frame_id") == i for i, f in frames.items()) else 0
    stacks = {}
    for start in frames:
        stack, i, seen = [], start, set()
        while i in frames and i not in seen:
            seen.add(i)
            stack.append(locations.get(frames[i].get("file_location_id"), "?"))
            i = frames[i].get("parent_frame_id", 0) - offset
        stacks[start] = stack
    return stacks


def module_name(hlo_text):
    m = re.match(r"HloModule ([\w.\-]+)", hlo_text)
    return m.group(1) if m else None


def op_categories(hlo_text):
    """{HLO instruction name: category} for every instruction of the compiled module's text (fusions' and loop
    bodies' too): by the source stacks of its metadata and of what it calls, then by what it computes. Control
    flow (while, conditional, call) maps to None: the ops inside are traced, and counted, each on its own."""
    stacks = source_stacks(hlo_text)
    computations = {name: [(instruction, opcode, rest) for instruction, _, opcode, rest in instructions]
                    for name, instructions in parse_computations(hlo_text)[0].items()}

    memo = {}

    def contents(computation):
        """(source lines, holds a dot/convolution, custom-call targets) of a computation and what it calls."""
        if computation not in memo:
            memo[computation] = ([], False, [])  # a recursion guard; filled below
            sources, has_dot, targets = [], False, []
            for _, opcode, line in computations.get(computation, ()):
                s, d, t = described(opcode, line)
                sources += s
                has_dot |= d
                targets += t
            memo[computation] = (sources, has_dot, targets)
        return memo[computation]

    def described(opcode, line):
        sources = []
        frame = _FRAME_ID.search(line)
        if frame:
            sources += stacks.get(int(frame.group(1)), [])
        sources += _SOURCE_FILE.findall(line) + _OP_NAME.findall(line)
        has_dot = opcode in ("dot", "convolution")
        targets = _TARGET.findall(line) if opcode == "custom-call" else []
        for callee in _CALLS.findall(line):
            s, d, t = contents(callee)
            sources, has_dot, targets = sources + s, has_dot or d, targets + t
        return sources, has_dot, targets

    categories = {}
    for instructions in computations.values():
        for name, opcode, line in instructions:
            if opcode in _CONTAINERS:  # its ops are traced each on its own
                categories[name] = None
                continue
            sources, has_dot, targets = described(opcode, line)
            categories[name] = classify(sources, has_dot, targets)
    return categories


def classify(sources, has_dot, targets):
    """The category of an op from its source lines, whether it holds a matmul and its custom-call targets."""
    text = "\n".join(sources)
    for category, pattern in _SOURCE_RULES:
        if pattern.search(text):
            return category
    if any(_ATTENTION_TARGET.search(t) for t in targets):
        return "attention"
    if has_dot or any(_MATMUL_TARGET.search(t) for t in targets):
        return "matmuls"
    return "elementwise and other"


def kernel_category(name):
    """The category of a kernel the HLO does not name, by its name."""
    if _COPY_KERNEL.search(name):
        return "other programs"
    if _ATTENTION_TARGET.search(name):
        return "attention"
    return "matmuls" if _MATMUL_KERNEL.search(name) else "elementwise and other"


class Trace:
    """jax.profiler.trace into directory; wall_s: the seconds spent inside the with block."""

    def __init__(self, directory):
        self.directory, self.wall_s = directory, None

    def __enter__(self):
        import jax
        os.makedirs(self.directory, exist_ok=True)
        jax.profiler.start_trace(self.directory)
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import jax
        self.wall_s = time.perf_counter() - self.t
        jax.profiler.stop_trace()

    def xplane_path(self):
        """The newest .xplane.pb written under the directory."""
        paths = glob.glob(os.path.join(self.directory, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise FileNotFoundError(f"no .xplane.pb under {self.directory}")
        return max(paths, key=os.path.getmtime)


def _stats(event):
    try:
        return dict(event.stats)
    except Exception:  # a stat whose value the binding cannot convert: none of ours
        return {}


def op_events(profile):
    """[(op name or None, module name or None, kernel name, start_ns, duration_ns)] of the ops the trace ran: a
    device plane's "XLA Ops" line where there is one, else the kernels of its "Stream" lines (their hlo_op where
    they carry one); with no device plane (XLA:CPU), the host's events that carry hlo_op."""
    devices = [p for p in profile.planes if p.name.startswith("/device:") and "CUSTOM" not in p.name]
    out = []
    for plane in devices:
        lines = list(plane.lines)
        xla_ops = [line for line in lines if line.name == "XLA Ops"]
        streams = [line for line in lines if line.name.startswith("Stream")]  # the kernels, each on its stream
        for line in xla_ops or streams:
            for e in line.events:
                s = _stats(e)
                op = s.get("hlo_op") or (e.name if xla_ops else None)
                out.append((op, s.get("hlo_module"), e.name, e.start_ns, e.duration_ns))
    if not out:
        for plane in profile.planes:
            if plane.name.startswith("/host:"):
                for line in plane.lines:
                    for e in line.events:
                        s = _stats(e)
                        if s.get("hlo_op"):
                            out.append((s["hlo_op"], s.get("hlo_module"), e.name, e.start_ns, e.duration_ns))
    return out


def busy_ns(intervals):
    """Nanoseconds covered by the union of [start, end) intervals."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def breakdown(trace, hlo_text, steps, wall_s, top=10):
    """{"steps", "wall_ms" (per step), "busy_ms", "ops_per_step", "categories": {name: {"ms", "pct"}} (per step,
    of the wall time), "top_ops": [{"op", "category", "ms", "count"}], "unattributed_ms", "overlap"} of a trace
    (an .xplane.pb path, or a jax.profiler.ProfileData) of `steps` steps of the compiled module whose HLO text is
    hlo_text, which took wall_s seconds."""
    from jax.profiler import ProfileData
    profile = ProfileData.from_file(trace) if isinstance(trace, str) else trace
    categories, ours = op_categories(hlo_text), module_name(hlo_text)
    events = op_events(profile)
    raw, per_op, unattributed, spans = collections.Counter(), collections.defaultdict(lambda: [0, 0]), 0, []
    events = [e for e in events if not (e[0] in categories and categories[e[0]] is None)]
    named = {m.split("(")[0] for _, m, _, _, _ in events if m}  # a module stat may carry "(program id)"
    ours_named = ours in named or not named  # else the trace names modules otherwise: go by op names alone
    for op, module, kernel, start, duration in events:
        if op in categories and (module is None or not ours_named or module.split("(")[0] == ours):
            category, label = categories[op], op
        elif op is not None:  # another program's op (its module is not ours)
            category, label = "other programs", f"{module}/{op}"
        else:
            category, label = kernel_category(kernel), kernel[:80]
            unattributed += duration
        raw[category] += duration
        per_op[(label, category)][0] += duration
        per_op[(label, category)][1] += 1
        spans.append((start, start + duration))
    busy = busy_ns(spans)
    summed = sum(raw.values())
    scale = min(1.0, busy / summed) if summed else 1.0  # ops that ran at once count once
    wall_ns = wall_s * 1e9
    out = {"steps": steps, "wall_ms": round(wall_ns / steps / 1e6, 3), "busy_ms": round(busy / steps / 1e6, 3),
           "ops_per_step": round(len(events) / steps, 1), "unattributed_ms": round(unattributed / steps / 1e6, 3),
           "overlap": round(summed / busy, 3) if busy else None, "module": ours, "categories": {}}
    shares = {c: raw[c] * scale for c in CATEGORIES[:-1]}
    shares["host (device idle)"] = max(0.0, wall_ns - busy)
    for c in CATEGORIES:
        out["categories"][c] = {"ms": round(shares[c] / steps / 1e6, 3),
                                "pct": round(100 * shares[c] / wall_ns, 1) if wall_ns else None}
    ranked = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:top]
    out["top_ops"] = [{"op": label, "category": category, "ms": round(t / steps / 1e6, 3), "count": n // steps or n}
                      for (label, category), (t, n) in ranked]
    return out


def format_breakdown(b):
    """The breakdown as a printed table (one line per category, then the top ops)."""
    lines = [f"  where a step's time goes (profiler trace of {b['steps']} steps, {b['wall_ms']:.2f} ms a step "
             f"traced, {b['ops_per_step']:.0f} ops a step, module {b['module']})"]
    for c, v in b["categories"].items():
        lines.append(f"    {c:<24} {v['ms']:>10.3f} ms {v['pct']:>6.1f}%")
    if b["overlap"] and b["overlap"] > 1.01:
        lines.append(f"    (ops ran at once: their times summed to {b['overlap']:.2f}x the time any op ran; scaled)")
    if b["unattributed_ms"]:
        lines.append(f"    ({b['unattributed_ms']:.3f} ms a step of kernels without an HLO op, sorted by kernel name)")
    lines.append("    top ops:")
    for t in b["top_ops"]:
        lines.append(f"      {t['ms']:>9.3f} ms  x{t['count']:<4} {t['category']:<22} {t['op']}")
    return "\n".join(lines)
