"""Where a train step's device time goes: a `jax.profiler` trace reduced to a small JSON summary.

    python benchmarks/profile_summary.py TRACE_DIR --hlo=HLO.txt[.gz] --steps=3 --wall_s=0.6 [--out=FILE]

The GPU is lent rarely and briefly, so a trace is reduced where it was taken (benchmarks/gpu_profile.py
does it on the device) and only this summary travels: device time per step by category, forward /
backward / optimizer, the top ops with their share and the JAX source op each came from, and the gaps
in which the device sat idle (host time between kernels, a host sync).

Each kernel the profiler saw carries the HLO instruction it ran (`hlo_op`); the optimized HLO of the
same program (`compiled.as_text()`) says what that instruction is: a cuBLAS or Triton matmul, a cuDNN
attention, a fusion of elementwise work, a reduction (softmax, LayerNorm, loss), the dropout's integer
hash, a scatter (embedding gradients), a dynamic slice or update (the scanned layers' stacked weights
and gradients), a copy or transpose, a collective. The JAX op path in its metadata says forward,
backward (`transpose(`), or optimizer (the `optimizer` named scope of trainer.make_train_step). Each
category also counts its kernels a step and those under 10 µs with their time: many tiny kernels (a leaf per
layer each updated on its own) cost launches, not bandwidth.

On the CPU (the dry run) the same reduction reads the host threads' XLA op events instead of a GPU's
streams; events overlap across threads there, so shares are of summed op time, not of wall time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
from typing import Iterable, Optional

CATEGORIES = (
    "matmul",
    "attention (cuDNN)",
    "reduction (softmax, LayerNorm, loss)",
    "dropout hash (integer)",
    "rng",
    "scatter (embedding and gather gradients)",
    "gather",
    "dynamic slice/update (scanned layers)",
    "copy/transpose",
    "collective",
    "elementwise",
    "optimizer",
    "other (a kernel naming no HLO op)",
)
SHORT_NS = 10_000  # a kernel under 10 µs: its launch and tail, not its work (the loop's per-layer optimizer updates)
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_MOVES = {
    "copy",
    "transpose",
    "bitcast",
    "reshape",
    "parameter",
    "broadcast",
    "slice",
    "concatenate",
    "tuple",
    "get-tuple-element",
    "constant",
    "pad",
    "copy-start",
    "copy-done",
}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*\(.*\{\s*$")


# --- The optimized HLO: what each instruction is --------------------------------------------------------


def _split_shape(rest: str) -> tuple[str, str]:
    """`(f32[2], s32[]) tuple(...)` → ("(f32[2], s32[])", "tuple(...)"): a tuple shape's parentheses matched."""
    if not rest.startswith("("):
        shape, _, tail = rest.partition(" ")
        return shape, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[: i + 1], rest[i + 1 :].lstrip()
    return rest, ""


def parse_hlo(text: str) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """(instruction name → {opcode, shape, op_name, calls, target, computation}, computation → its opcodes)."""
    instructions: dict[str, dict] = {}
    bodies: dict[str, list[str]] = collections.defaultdict(list)
    computation = ""
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            header = _COMPUTATION.match(line)
            if header and "->" in line:
                computation = header.group("name")
            continue
        shape, tail = _split_shape(line[match.end() :])
        opcode = re.match(r"[\w\-]+", tail)
        if not opcode:
            continue
        opcode = opcode.group(0)
        op_name = re.search(r'op_name="([^"]*)"', tail)
        calls = re.search(r"calls=%?([\w.\-]+)", tail)
        target = re.search(r'custom_call_target="([^"]*)"', tail)
        kind = re.search(r"kind=(k\w+)", tail)
        bodies[computation].append(opcode + (f":{target.group(1)}" if target else ""))
        instructions[match.group("name")] = dict(
            opcode=opcode,
            shape=shape[:120],
            op_name=op_name.group(1) if op_name else "",
            calls=calls.group(1) if calls else None,
            target=target.group(1) if target else None,
            kind=kind.group(1) if kind else None,
            computation=computation,
        )
    return instructions, dict(bodies)


def _body_opcodes(instruction: dict, bodies: dict[str, list[str]]) -> list[str]:
    ops = [instruction["opcode"] + (f":{instruction['target']}" if instruction["target"] else "")]
    if instruction["calls"]:
        ops += bodies.get(instruction["calls"], [])
    return ops


_KERNEL_CATEGORIES = (
    (r"nvjet|gemm|xmma|cutlass|cublas", "matmul"),
    (r"cudnn|fmha|flash", "attention (cuDNN)"),
    (r"memcpy|memset", "copy/transpose"),
    (r"nccl", "collective"),
)


def category(instruction: Optional[dict], bodies: dict[str, list[str]], kernel: str = "") -> str:
    """One of CATEGORIES for an HLO instruction (None: a kernel that names no instruction, by its name)."""
    if instruction is None:
        return next((c for pattern, c in _KERNEL_CATEGORIES if re.search(pattern, kernel.lower())), CATEGORIES[-1])
    if "optimizer" in instruction["op_name"].split("/"):
        return "optimizer"
    ops = _body_opcodes(instruction, bodies)
    opcodes = {op.split(":")[0] for op in ops}
    targets = " ".join(op.split(":", 1)[1].lower() for op in ops if ":" in op)
    if "cudnn" in targets and ("fmha" in targets or "attention" in targets or "sdpa" in targets):
        return "attention (cuDNN)"
    if {"dot", "convolution"} & opcodes or re.search(r"gemm|matmul|cublas", targets):
        return "matmul"
    if any(op.startswith(c) for op in opcodes for c in _COLLECTIVES):
        return "collective"
    if "scatter" in opcodes:
        return "scatter (embedding and gather gradients)"
    if {"xor", "shift-right-logical"} <= opcodes:
        return "dropout hash (integer)"
    if "rng-bit-generator" in opcodes or "rng" in opcodes or "threefry" in targets:
        return "rng"
    if "reduce" in opcodes or "reduce-window" in opcodes:
        return "reduction (softmax, LayerNorm, loss)"
    if "gather" in opcodes:
        return "gather"
    if {"dynamic-update-slice", "dynamic-slice"} & opcodes:
        return "dynamic slice/update (scanned layers)"
    if opcodes <= _MOVES | {"fusion"}:
        return "copy/transpose"
    return "elementwise"


def phase(instruction: Optional[dict]) -> str:
    """forward, backward (JAX's transpose of the forward), optimizer, or other."""
    if instruction is None:
        return "other"
    path = instruction["op_name"]
    if "optimizer" in path.split("/"):
        return "optimizer"
    if "transpose(" in path:
        return "backward"
    return "forward" if path else "other"


# --- The trace: which instruction ran when, for how long -----------------------------------------------------


def trace_layout(xspace_path: str) -> list[dict]:
    """Planes, their lines, event counts and the stat names of a first event: what to read if the
    reduction above ever finds nothing (another jaxlib may lay its trace out differently)."""
    from jax.profiler import ProfileData

    layout = []
    for plane in ProfileData.from_file(xspace_path).planes:
        for line in plane.lines:
            events = list(line.events)
            if events:
                layout.append(
                    dict(
                        plane=plane.name,
                        line=line.name,
                        events=len(events),
                        first=events[0].name[:80],
                        stats=sorted(k for k, _ in events[0].stats),
                    )
                )
    return layout


def _events(xspace_path: str) -> tuple[list[tuple[str, str, int, int]], str]:
    """((hlo op, kernel or event name, start ns, duration ns) of every device op, where they came from).

    Inside a CUDA graph (XLA's command buffers, on by default) a kernel's hlo_op is the command buffer
    (`command_buffer_54`), and only the kernel's own name says which fusion it ran."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(xspace_path)
    planes = list(data.planes)
    devices = [
        p for p in planes if p.name.startswith("/device:") and any(ln.name.startswith("Stream") for ln in p.lines)
    ]
    source = "device streams" if devices else "host XLA op events"
    out = []
    for plane in devices or [p for p in planes if p.name.startswith("/host:CPU")]:
        for line in plane.lines:
            if devices and not line.name.startswith("Stream"):
                continue  # derived lines (XLA Ops, Steps) repeat the streams' kernels
            for event in line.events:
                stats = dict(event.stats)
                op = stats.get("hlo_op")
                if op is None and not devices:
                    continue  # host bookkeeping, not an op
                out.append((str(op) if op is not None else "", event.name, int(event.start_ns), int(event.duration_ns)))
    return out, source


def _busy_and_gaps(events: list[tuple[str, int, int]], top: int = 5) -> tuple[int, list[dict]]:
    """(ns during which some op ran, the `top` longest idle gaps between ops with the ops around them)."""
    spans = sorted((start, start + dur, name) for name, start, dur in events)
    busy, gaps = 0, []
    end, before = None, None
    for start, stop, name in spans:
        if end is None or start > end:
            if end is not None:
                gaps.append((start - end, before, name))
            busy += stop - start
            end, before = stop, name
        elif stop > end:
            busy += stop - end
            end, before = stop, name
    gaps.sort(reverse=True)
    return busy, [dict(gap_us=round(g / 1e3, 1), after=a, before=b) for g, a, b in gaps[:top]]


def instruction_of(op: str, kernel: str, instructions: dict, by_kernel_name: dict[str, str]) -> str:
    """The HLO instruction an event ran, or `<kernel>` where none can be told. A kernel is named after its
    fusion, '.' written '_' (loop_add_fusion_3); inside a CUDA graph its hlo_op is the command buffer, and
    library kernels (cuBLAS's nvjet_*, cuDNN's) and memcpys there name no instruction at all."""
    for name in (op, kernel, by_kernel_name.get(kernel)):
        if name and name in instructions:
            return name
    return f"<{kernel}>" if op.startswith("command_buffer") or not op else op


def find_xspace(trace_dir: str) -> str:
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"{trace_dir}: no *.xplane.pb under it; was jax.profiler.start_trace given this dir?")
    return paths[-1]


def summarize(trace_dir: str, hlo_text: str, steps: int, wall_s: Optional[float] = None, top: int = 30) -> dict:
    """The JSON summary of `steps` traced steps (see the module docstring); times are per step."""
    instructions, bodies = parse_hlo(hlo_text)
    xspace = find_xspace(trace_dir)
    events, source = _events(xspace)
    by_kernel_name = {name.replace(".", "_"): name for name in instructions}
    events = [
        (instruction_of(op, kernel, instructions, by_kernel_name), start, dur) for op, kernel, start, dur in events
    ]
    by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])  # ns, kernels, short ns, short ones
    for name, _, dur in events:
        short = dur < SHORT_NS
        by_op[name][0] += dur
        by_op[name][1] += 1
        by_op[name][2] += dur if short else 0
        by_op[name][3] += short
    total = sum(v[0] for v in by_op.values()) or 1
    per_step = lambda ns: round(ns / 1e6 / steps, 4)  # noqa: E731  (ms a step)
    categories: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    phases: dict[str, int] = collections.Counter()
    for name, counts in by_op.items():
        instruction = instructions.get(name)
        row = categories[category(instruction, bodies, name)]
        row[:] = [a + b for a, b in zip(row, counts)]
        phases[phase(instruction)] += counts[0]
    busy, gaps = _busy_and_gaps(events)
    ops = []
    for name, (dur, count, _, _) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        instruction = instructions.get(name) or {}
        ops.append(
            dict(
                op=name,
                ms=per_step(dur),
                share=round(dur / total, 4),
                calls=count // max(steps, 1),
                category=category(instructions.get(name), bodies, name),
                phase=phase(instructions.get(name)),
                opcode=instruction.get("opcode"),
                shape=instruction.get("shape"),
                source=instruction.get("op_name", "")[-160:],
            )
        )
    out = dict(
        source=source,
        steps=steps,
        ops_seen=len(by_op),
        events=len(events),
        matched_hlo=round(sum(v[0] for k, v in by_op.items() if k in instructions) / total, 4),
        op_ms_per_step=per_step(total),
        busy_ms_per_step=per_step(busy),
        categories={
            k: dict(
                ms=per_step(v[0]),
                share=round(v[0] / total, 4),
                kernels=round(v[1] / steps, 1),
                short_kernels=round(v[3] / steps, 1),  # under SHORT_NS: bound by launching, not by work
                short_ms=per_step(v[2]),
            )
            for k, v in sorted(categories.items(), key=lambda kv: -kv[1][0])
        },
        phases={k: dict(ms=per_step(v), share=round(v / total, 4)) for k, v in phases.most_common()},
        top_ops=ops,
        longest_idle_gaps=gaps,
    )
    if out["matched_hlo"] < 0.5:  # most time unexplained: keep the trace's layout for whoever reads this
        out["trace_layout"] = trace_layout(xspace)
    if wall_s is not None:
        out["wall_ms_per_step"] = round(wall_s * 1e3 / steps, 4)
        # What the device did not cover of the host's clock: launches, syncs, Python, dispatch.
        out["idle_ms_per_step"] = round(out["wall_ms_per_step"] - out["busy_ms_per_step"], 4)
    return out


def read_text(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def main(argv: Optional[Iterable[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace_dir")
    p.add_argument("--hlo", required=True, help="the traced program's optimized HLO (compiled.as_text()), .gz too")
    p.add_argument("--steps", type=int, required=True, help="how many steps the trace holds")
    p.add_argument("--wall_s", type=float, default=None, help="host seconds the traced steps took")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default="", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    summary = summarize(args.trace_dir, read_text(args.hlo), args.steps, args.wall_s, args.top)
    text = json.dumps(summary, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
