"""What a compiled step's kernels read and write: the bytes of memory traffic in an optimized HLO program.

    python benchmarks/hlo_traffic.py HLO.txt[.gz] [--bandwidth=4.8e12]

Each kernel of the program (every instruction of the entry computation that launches one: a fusion, a
library call such as cuBLAS or cuDNN, a copy; not parameters, tuples or bitcasts) reads its operands and
writes its result; a while loop's body counts once per known iteration. Summed by the categories of
profile_summary.py, the bytes say what the step must move through HBM at least, and divided by the chip's
bandwidth, the least time that takes: a floor that ignores caches and how well each kernel runs, but that a
change can be compared by without a device (benchmarks/gpu_compile.py, on a program compiled for a GPU that
is not here). Matmuls and attention are bound by their FLOPs, not their bytes: their rows are for context.

An operand a fusion only slices (a layer's weights out of a scanned stack) counts the slices' bytes, not the
whole operand's. The count is a lower bound for a kernel that reads an input twice; what changes between two
variants of one step is what it is for.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Iterable, Optional

import profile_summary as summary_lib

_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
_ITEM_BYTES.update({"f64": 8, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1})
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_ITEM_BYTES, key=len, reverse=True)) + r")\[([\d,]*)\]")
# What launches no kernel: names, views and constants.
_NO_KERNEL = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "after-all", "partition-id"}
_NO_KERNEL |= {"replica-id", "opt-barrier", "add-dependency"}
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
# The computations a control-flow instruction runs: a while's body (its condition is a scalar), a call's, and
# every branch of a conditional (each counted, an upper bound: one of them runs).
_CALLED = {
    "while": re.compile(r"\bbody=%?([\w.\-]+)"),
    "call": re.compile(r"\bto_apply=%?([\w.\-]+)"),
    "conditional": re.compile(r"%([\w.\-]+)"),
}
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}|(?:true|false)_computation=(%[\w.\-]+)")
_FUSED = re.compile(r"\bcalls=%?([\w.\-]+)")
_PARAMETER = re.compile(r"parameter\((\d+)\)")
_SLICES = ("slice", "dynamic-slice")
_CASTS = ("convert", "bitcast", "copy")  # element-wise, one operand: a slice after them reads as much


def array_bytes(shape: str, skip_workspace: bool = False) -> int:
    """Bytes of every array in an HLO shape (a tuple's elements summed); `skip_workspace`: not the s8 scratch
    buffer a library call returns beside its result."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        if skip_workspace and dtype == "s8":
            continue
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _ITEM_BYTES[dtype]
    return total


def _operands(tail: str, opcode: str) -> list[str]:
    """The %names between the opcode's parentheses."""
    args = tail[len(opcode) :]
    depth = 0
    for i, ch in enumerate(args):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i:
            return re.findall(r"%([\w.\-]+)", args[: i + 1])
    return []


def _instruction(line: str) -> tuple[str, str, str, str]:
    """(name, result shape, the text after it, opcode) of an HLO instruction line."""
    match = summary_lib._INSTRUCTION.match(line)
    shape, tail = summary_lib._split_shape(line[match.end() :])
    opcode = re.match(r"[\w\-]+", tail)
    return match.group("name"), shape, tail, opcode.group(0) if opcode else ""


def _sliced_reads(lines: list[str]) -> dict[int, int]:
    """{operand index: bytes read} for each parameter of a fused computation that only slices read, directly or
    through element-wise casts (the scanned stack's f32 weights, cast to bf16, then a layer sliced out): a fusion
    reads those elements of the operand, not all of it."""
    params: dict[str, tuple[int, str]] = {}
    shapes: dict[str, str] = {}
    users: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)  # operand → (opcode, user) pairs
    for line in lines:
        name, shape, tail, opcode = _instruction(line)
        shapes[name] = shape
        if opcode == "parameter":
            params[name] = (int(_PARAMETER.search(tail).group(1)), shape)
            continue
        for i, operand in enumerate(_operands(tail, opcode)):
            users[operand].append((opcode if i == 0 else "other", name))

    def sliced_elements(name: str) -> int | None:  # None: something reads it whole
        if not users[name]:
            return None
        total = 0
        for opcode, user in users[name]:
            if opcode in _SLICES:
                total += array_bytes(shapes[user]) // _ITEM_BYTES[_ARRAY.search(shapes[user]).group(1)]
            elif opcode in _CASTS:
                inner = sliced_elements(user)
                if inner is None:
                    return None
                total += inner
            else:
                return None
        return total

    out = {}
    for name, (index, shape) in params.items():
        elements = sliced_elements(name)
        if elements is not None:
            out[index] = elements * _ITEM_BYTES[_ARRAY.search(shape).group(1)]
    return out


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """(computation name → its instruction lines, the entry computation's name)."""
    computations: dict[str, list[str]] = collections.defaultdict(list)
    name, entry = "", ""
    for line in text.splitlines():
        if summary_lib._INSTRUCTION.match(line):
            computations[name].append(line)
            continue
        header = summary_lib._COMPUTATION.match(line)
        if header and "->" in line:
            name = header.group("name")
            entry = name if line.lstrip().startswith("ENTRY") else entry
    return computations, entry


def kernels(text: str) -> list[dict]:
    """Every kernel the program launches a step, with what it reads and writes and how many times it runs."""
    computations, entry = _computations(text)
    out: list[dict] = []

    def walk(name: str, times: int, depth: int = 0) -> None:
        shapes: dict[str, str] = {}
        for line in computations.get(name, []):
            instruction, shape, tail, opcode = _instruction(line)
            shapes[instruction] = shape
            if opcode in _NO_KERNEL or not opcode:
                continue
            if opcode in _CALLED and depth < 4:
                trips = _TRIP_COUNT.search(tail)
                where = "".join("".join(m) for m in _BRANCHES.findall(tail)) if opcode == "conditional" else tail
                for called in _CALLED[opcode].findall(where):
                    walk(called, times * (int(trips.group(1)) if trips else 1), depth + 1)
                continue
            fused = _FUSED.search(tail) if opcode == "fusion" else None
            sliced = _sliced_reads(computations.get(fused.group(1), [])) if fused else {}
            read = sum(sliced.get(i, array_bytes(shapes.get(o, ""))) for i, o in enumerate(_operands(tail, opcode)))
            written = array_bytes(shape, skip_workspace=opcode == "custom-call")
            out.append(dict(name=instruction, opcode=opcode, read=read * times, written=written * times, runs=times))

    walk(entry, 1)
    return out


def traffic(text: str, bandwidth: Optional[float] = None) -> dict:
    """Kernels and bytes a step, by profile_summary's categories (with ms at `bandwidth` bytes/s if given)."""
    instructions, bodies = summary_lib.parse_hlo(text)
    by_category: dict[str, dict] = collections.defaultdict(lambda: dict(kernels=0, read_bytes=0, written_bytes=0))
    for k in kernels(text):
        row = by_category[summary_lib.category(instructions.get(k["name"]), bodies, k["name"])]
        row["kernels"] += k["runs"]
        row["read_bytes"] += k["read"]
        row["written_bytes"] += k["written"]
    rows = dict(sorted(by_category.items(), key=lambda kv: -(kv[1]["read_bytes"] + kv[1]["written_bytes"])))
    bound = {c for c in rows if c in ("matmul", "attention (cuDNN)")}  # their time is their FLOPs'
    memory_bound = sum(r["read_bytes"] + r["written_bytes"] for c, r in rows.items() if c not in bound)
    out = dict(
        kernels=sum(r["kernels"] for r in rows.values()),
        bytes=sum(r["read_bytes"] + r["written_bytes"] for r in rows.values()),
        memory_bound_bytes=memory_bound,
        categories=rows,
    )
    if bandwidth:
        out["memory_bound_ms_at_bandwidth"] = round(memory_bound / bandwidth * 1e3, 3)
        for row in rows.values():
            row["ms_at_bandwidth"] = round((row["read_bytes"] + row["written_bytes"]) / bandwidth * 1e3, 3)
    return out


def main(argv: Optional[Iterable[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hlo", help="an optimized HLO program (compiled.as_text()), .gz too")
    p.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s (an H200's HBM: 4.8e12)")
    args = p.parse_args(argv)
    print(json.dumps(traffic(summary_lib.read_text(args.hlo), args.bandwidth), indent=1))


if __name__ == "__main__":
    main()
