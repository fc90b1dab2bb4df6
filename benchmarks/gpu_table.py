"""The README's GPU table in one command: benchmarks/train_step.py over models, lengths, kernels, packing.

    python benchmarks/gpu_table.py [--sizes=base,large] [--seqs=128,512] [--attentions=xla,cudnn]
                                   [--steps=10] [--torch_compile] [--results=FILE] [--log=FILE]
    python benchmarks/gpu_table.py --family=modernbert --seqs=512,1024   # beside ModernBertForMaskedLM

For every (model, seq, attention) it runs `train_step.py --frameworks=jax,jax_packed,torch` in a fresh
process (so one case's GPU memory never limits the next): bertjax's train step on padded rows and on
packed rows, and `transformers.BertForPreTraining` (bf16 autocast, SDPA) on the same padded rows, timed
interleaved. PyTorch runs once per (model, seq), beside the first attention. Each JSON row goes to
--results (default benchmarks/results/gpu_table.jsonl, appended) and the markdown table to stdout.

Batches per device (`--batches`, MODEL:SEQ:ROWS) default to guesses for an 80 GB H100 (bf16 compute,
float32 params and Adam state), not yet tried on one: a case that runs out of memory comes back as a row
saying so; lower its batch. Needs jax, torch and transformers, not TensorFlow (synthetic batches).
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCHES = {
    "bert": "base:128:256,base:512:64,large:128:128,large:512:32",
    "modernbert": "base:128:256,base:512:64,base:1024:32,large:512:32,large:1024:16",
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="base,large")
    p.add_argument("--seqs", default="128,512")
    p.add_argument("--attentions", default="xla,cudnn")
    p.add_argument(
        "--family",
        default="bert",
        choices=sorted(BATCHES),
        help="modernbert: configs/modernbert.py beside transformers.ModernBertForMaskedLM",
    )
    p.add_argument(
        "--batches",
        default="",
        help="MODEL:SEQ:ROWS list (default: the family's guesses above); others use train_step.py's default",
    )
    p.add_argument("--frameworks", default="jax,jax_packed", help="bertjax's rows: jax (padded), jax_packed")
    p.add_argument("--log", default="", help="append each case's stderr here (why a case failed, compile times)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--torch_compile", action="store_true")
    p.add_argument("--extra", default="", help="more train_step.py flags, space-separated (e.g. --no_peak)")
    p.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results", "gpu_table.jsonl"))
    return p.parse_args()


def run_case(args, size: str, seq: int, attention: str, with_torch: bool) -> dict:
    batches = {tuple(b.split(":")[:2]): b.split(":")[2] for b in (args.batches or BATCHES[args.family]).split(",") if b}
    frameworks = args.frameworks + (",torch" if with_torch else "")
    command = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "train_step.py"),
        f"--family={args.family}",
        f"--sizes={size}",
        f"--seq={seq}",
        f"--attention={attention}",
        f"--frameworks={frameworks}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--batch={batches.get((size, str(seq)), 0)}",
    ]
    command += ["--torch_compile"] * args.torch_compile + args.extra.split()
    print("gpu_table: " + " ".join(command[1:]), file=sys.stderr, flush=True)
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"=== {' '.join(command[1:])} (exit {run.returncode})\n{run.stderr}\n")
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode or not rows:
        lines = run.stderr.strip().splitlines() or ["no output"]
        # The exception's own line, not jax's "For simplicity, JAX has removed its internal frames..." after it.
        error = next((line for line in reversed(lines) if re.match(r"[\w.]*(Error|Exception|Exit)\b", line)), lines[-1])
        error = error[:300]
        return dict(family=args.family, size=size, seq=seq, attention=attention, error=error)
    return dict(rows[-1], attention=attention)


def markdown(rows: list[dict]) -> str:
    def cell(r, key, fmt="{:,.0f}"):
        return fmt.format(r[key]) if r.get(key) is not None else "—"

    lines = [
        "| model | seq | batch | dtype | attention | bertjax seq/s | bertjax MFU | packed: real tokens/s vs "
        "padded | PyTorch seq/s | PyTorch MFU | bertjax ÷ PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = r["size"] if r.get("family", "bert") == "bert" else f"{r['family']}-{r['size']}"
        if "error" in r:
            lines.append(f"| {name} | {r['seq']} | — | — | {r['attention']} | failed: {r['error']} " + "| —" * 5 + " |")
            continue
        lines.append(
            f"| {name} | {r['seq']} | {r['batch']} | {r['dtype']} | {r['attention']} | "
            f"{cell(r, 'jax_seq_per_s')} | "
            f"{cell(r, 'jax_mfu', '{:.1%}')} | {cell(r, 'packed_speedup', '{:.2f}×')} | "
            f"{cell(r, 'torch_seq_per_s')} | {cell(r, 'torch_mfu', '{:.1%}')} | {cell(r, 'speedup', '{:.2f}×')} |"
        )
    return "\n".join(lines)


def main():
    args = parse_args()
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    rows = []
    for size in args.sizes.split(","):
        for seq in (int(s) for s in args.seqs.split(",")):
            for i, attention in enumerate(args.attentions.split(",")):
                row = dict(
                    run_case(args, size, seq, attention, with_torch=i == 0), date=datetime.date.today().isoformat()
                )
                with open(args.results, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                rows.append(row)
    device = next((r["device"] for r in rows if "device" in r), "?")
    print(f"\n{device}, {datetime.date.today().isoformat()}:\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
