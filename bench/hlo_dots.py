"""The matmuls of a compiled XLA program and how often one run executes each, from its HLO text.

    dots = dots_per_run(compiled.as_text())   # [Dot(lhs, rhs, dtype, out_dtype, dimension_numbers, count)]

Every `dot` instruction counts, also those inside fusions (XLA:CPU's library fusions hold theirs there)
and loop bodies; a while loop multiplies its body by the trip count XLA recorded for it
(backend_config known_trip_count). A loop without one counts once and is listed in `unknown_trip_counts`.
Both branches of a conditional count once each (an upper bound). Operand shapes are their logical shapes.
"""
import collections
import math
import re
from dataclasses import dataclass

_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"^ ([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]")
_CALLEE = re.compile(r"\b(calls|to_apply|body|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


@dataclass(frozen=True)
class Dot:
    lhs: tuple
    rhs: tuple
    dtype: str  # the operands' HLO element type (f32, bf16, ...)
    out_dtype: str
    dimension_numbers: tuple  # ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), as lax.dot_general's
    count: int  # executions per run of the program

    @property
    def flops(self):
        """2 per multiply-add, one execution: every lhs element meets every rhs column it is not batched or
        contracted with."""
        (_, rhs_contract), (_, rhs_batch) = self.dimension_numbers
        free = [n for d, n in enumerate(self.rhs) if d not in rhs_contract and d not in rhs_batch]
        return 2 * math.prod(self.lhs) * math.prod(free)


def _dims(text, name):
    m = re.search(name + r"=\{([\d,]*)\}", text)
    return tuple(int(x) for x in m.group(1).split(",") if x) if m else ()


def parse_computations(hlo_text):
    """{computation: [(name, type, opcode, rest of line)]} and the entry computation's name (bench/profile_step.py
    reads the same)."""
    computations, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = computations.setdefault(m.group(1), [])
            entry = m.group(1) if line.startswith("ENTRY") else entry
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            type_, rest = _split_type(m.group(2))
            op = _OPCODE.match(rest)
            if op:
                current.append((m.group(1), type_, op.group(1), op.group(2)))
    return computations, entry


def _split_type(text):
    """'f32[4,8]{1,0} dot(...' -> ('f32[4,8]', ' dot(...'); a tuple type '(s32[], f32[2]) while(...' whole."""
    if text.startswith("("):
        depth = 0
        for i, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return text[:i + 1], text[i + 1:]
    end = text.find(" ")
    type_ = text[:end] if end >= 0 else text
    return re.sub(r"\{.*\}$", "", type_), text[len(type_):]


def _runs_per_computation(computations, entry):
    """How many times one run of the program executes each computation, and the loops without a trip count."""
    calls = collections.defaultdict(list)  # caller -> [(callee, times)]
    unknown = []
    for caller, instructions in computations.items():
        for name, _, opcode, rest in instructions:
            callees = [c for _, c in _CALLEE.findall(rest)]  # a while loop's condition holds no matmul
            m = _BRANCHES.search(rest)
            if m:
                callees += [c.strip().lstrip("%") for c in m.group(1).split(",")]
            times = 1
            if opcode == "while":
                trip = _TRIP_COUNT.search(rest)
                times = int(trip.group(1)) if trip else 1
                if not trip:
                    unknown.append(name)
            calls[caller] += [(c, times) for c in callees]
    runs = collections.Counter()

    def visit(computation, times):
        runs[computation] += times
        for callee, k in calls[computation]:
            visit(callee, times * k)
    visit(entry, 1)
    return runs, unknown


def dots_per_run(hlo_text):
    """The program's matmuls, one Dot per distinct (shapes, types, dimension numbers) with its executions per
    run, most FLOPs first; and the names of while loops whose trip count XLA did not record."""
    computations, entry = parse_computations(hlo_text)
    if entry is None:
        raise ValueError("no ENTRY computation in this HLO text")
    runs, unknown = _runs_per_computation(computations, entry)
    counts = collections.Counter()
    for computation, instructions in computations.items():
        if not runs[computation]:
            continue
        types = {name: t for name, t, _, _ in instructions}
        for name, out_type, opcode, rest in instructions:
            if opcode != "dot":
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])[:2]
            (lhs_dtype, lhs), (_, rhs) = (_shape(types[o]) for o in operands)
            numbers = ((_dims(rest, "lhs_contracting_dims"), _dims(rest, "rhs_contracting_dims")),
                       (_dims(rest, "lhs_batch_dims"), _dims(rest, "rhs_batch_dims")))
            counts[(lhs, rhs, lhs_dtype, _shape(out_type)[0], numbers)] += runs[computation]
    dots = [Dot(*key, count) for key, count in counts.items()]
    return sorted(dots, key=lambda d: -d.flops * d.count), unknown


def _shape(hlo_type):
    m = _ARRAY.match(hlo_type)
    if not m:
        raise ValueError(f"not an array type: {hlo_type}")
    return m.group(1), tuple(int(x) for x in m.group(2).split(",") if x)
