"""gpu_profile.py's variants compiled for a GPU that is not here: what each does to the program, between loans.

    python benchmarks/gpu_compile.py --out=DIR [--gpu=h200] [--case=bert:base:128:256] [--variants=a,b]
        [--base=--attention=cudnn]

The GPU is lent rarely; the compiler is not. jax's CUDA plugin compiles bertjax's real train step for an H100
or H200 on a machine without one (bertjax.runtime.gpu_targets; `pip install 'bertjax[cuda13]'`, or the
plugin alone where no variant needs cuDNN), so each variant of gpu_profile.py — a config field or an XLA flag
— can be compiled, each in a fresh process (`train_step.py --compile_for`), and its program read: how many
kernels a step launches, the bytes they move by category (hlo_traffic.py) and so the least time the
memory-bound ones take at the chip's bandwidth, the memory the step needs. It answers before a loan whether
a change compiles for the GPU at all, whether it removes the traffic it was made to remove, and which
variants are worth the loan's minutes; the loan answers how long the kernels really take.

What it cannot see: how fast each kernel runs (on the H200 the memory-bound kernels ran at 40-50% of the
bandwidth), matmul and attention speed, launch gaps. Untuned (no device), matmuls compile as cuBLAS calls.

Under --out: variants.jsonl (a row per variant: kernels, bytes, ms at bandwidth by category, temp bytes, its
flags) and, with --keep_hlo, each variant's optimized HLO (hlo_<variant>.txt.gz). A markdown table is printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import gpu_profile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GB = 1e9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results directory (created)")
    p.add_argument("--gpu", default="h200", help="a100, h100 or h200 (bertjax.runtime.gpu_targets)")
    p.add_argument("--case", default="bert:base:128:256", help="family:size:seq:batch")
    p.add_argument("--variants", default="", help="comma-separated (default: gpu_profile.ORDERS of the family)")
    p.add_argument("--base", default="", help="train_step.py flags for every variant, e.g. '--attention=cudnn'")
    p.add_argument("--xla_flags", default="", help="XLA flags for every variant (before the variant's own)")
    p.add_argument("--keep_hlo", action="store_true", help="keep each variant's optimized HLO under --out")
    p.add_argument("--timeout_s", type=float, default=600.0, help="per variant")
    return p.parse_args(argv)


# Variants with nothing to compile: they run PyTorch, or change only how the step is timed.
NOT_COMPILED = {
    "torch": "PyTorch's step: nothing of bertjax's to compile",
    "bigger_batch": "the same program, twice the rows",
}


def compile_variant(args, name: str, case: dict, scratch: str) -> dict:
    what, extra, xla, same = gpu_profile.VARIANTS[name]
    # gpu_profile's own worker command (--base, then the variant's flags, win), compiled instead of run
    worker = argparse.Namespace(steps=1, warmup=0, base=args.base, dry_run=False)
    command = gpu_profile.worker_command(worker, name, case, extra, os.path.join(scratch, name))
    command.append(f"--compile_for={args.gpu}")
    env = dict(os.environ, XLA_FLAGS=" ".join(f for f in (args.xla_flags, xla) if f), BERTJAX_NO_TCMALLOC="1")
    row = dict(variant=name, asks=what, same_numerics=same, flags=extra, xla_flags=xla, case=case, gpu=args.gpu)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return dict(row, error=f"timed out after {args.timeout_s:.0f}s")
    row["wall_s"] = round(time.perf_counter() - start, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return dict(row, error=gpu_profile._error_line(done.stderr))
    out = json.loads(lines[-1])
    traffic = out["traffic"]
    row.update(
        attention=out["attention"],
        compile_s=round(out["compile_s"], 1),
        temp_gib=out["temp_bytes"] and round(out["temp_bytes"] / 2**30, 3),
        kernels=traffic["kernels"],
        gb=round(traffic["bytes"] / GB, 3),
        memory_bound_gb=round(traffic["memory_bound_bytes"] / GB, 3),
        memory_bound_ms=traffic["memory_bound_ms_at_bandwidth"],
        categories={
            c: dict(
                kernels=r["kernels"], gb=round((r["read_bytes"] + r["written_bytes"]) / GB, 3), ms=r["ms_at_bandwidth"]
            )
            for c, r in traffic["categories"].items()
        },
        jax=out.get("jax"),
    )
    if args.keep_hlo and os.path.exists(os.path.join(scratch, name, "hlo.txt.gz")):
        shutil.copy(os.path.join(scratch, name, "hlo.txt.gz"), os.path.join(args.out, f"hlo_{name}.txt.gz"))
    return row


def markdown(rows: list[dict]) -> str:
    base = next((r for r in rows if r["variant"] == "baseline" and "kernels" in r), None)
    lines = [
        "| variant | kernels | GB moved | memory-bound GB | their ms at bandwidth | vs baseline | temp GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "kernels" not in r:
            lines.append(f"| {r['variant']} | {r.get('error') or r.get('skipped')} |" + " — |" * 5)
            continue
        delta = f"{r['memory_bound_ms'] - base['memory_bound_ms']:+.2f} ms" if base else "—"
        lines.append(
            f"| {r['variant']} | {r['kernels']:,} | {r['gb']:.1f} | {r['memory_bound_gb']:.1f} | "
            f"{r['memory_bound_ms']:.2f} | {delta} | {r['temp_gib']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    family, size, seq, batch = args.case.split(":")
    case = dict(family=family, size=size, seq=int(seq), batch=int(batch))
    names = [n.strip() for n in args.variants.split(",") if n.strip()] or list(gpu_profile.ORDERS[family])
    unknown = set(names) - set(gpu_profile.VARIANTS) - {"combined"}
    if unknown:
        raise SystemExit(f"--variants: {sorted(unknown)} unknown; choose from {', '.join(gpu_profile.VARIANTS)}.")
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="gpu_compile_")
    rows = []
    for name in names:
        if name == "combined" or name in NOT_COMPILED:
            rows.append(dict(variant=name, skipped=NOT_COMPILED.get(name, "made from timings, on the GPU")))
            continue
        print(f"gpu_compile: {name} for {args.gpu}", file=sys.stderr, flush=True)
        row = compile_variant(args, name, case, scratch)
        print(f"gpu_compile: {name}: {row.get('error') or str(row['kernels']) + ' kernels'}", file=sys.stderr)
        rows.append(row)
    shutil.rmtree(scratch, ignore_errors=True)
    today = datetime.date.today().isoformat()
    with open(os.path.join(args.out, "variants.jsonl"), "a") as f:
        for row in rows:
            f.write(json.dumps(dict(row, date=today)) + "\n")
    print(f"\n{args.case} compiled for {args.gpu} (no GPU here), {today}:\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
