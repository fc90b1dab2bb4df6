"""Where bertjax's GPU step loses its time, in one short command: an A/B matrix of the step, and profiles.

    python benchmarks/gpu_profile.py --out=DIR [--case=bert:base:128:256] [--variants=a,b] [--budget_s=420]
        [--base=--attention=cudnn]     # train_step.py flags every variant starts from
    python benchmarks/gpu_profile.py --out=DIR --dry_run      # on the CPU: every variant's code path, the family's tiny size

The GPU is lent rarely (15 minutes a session, one command at most 10), so one command answers as many
questions as it can. Each variant below is the train step of one case (family:size:seq:batch) with one
setting changed — a config field or an XLA flag — run by `train_step.py` in a fresh process (so flags take
effect and one variant's memory never limits the next), timed after warm-up (median of synced steps, and
steps dispatched back to back), then traced (`jax.profiler`, 3 steps) and reduced on the spot to a small
summary by `profile_summary.py`: device time by category, forward / backward / optimizer, the top ops
with the JAX op each came from, and the idle gaps. `torch` is `transformers`' step on the same rows, the
reference to beat. Variants run in the order below, the most telling first; once the time left is under
--budget_s's share a variant needs, the rest are listed as skipped, never half-run. After the single
changes, `combined` runs every same-numerics change that beat the baseline by more than the noise, together.

Everything goes under --out (copied back from the device; at most 8 files):
  variants.jsonl   one row per variant: step_s, pipelined_step_s, seq/s, MFU, ratio to baseline, its flags
  profiles.jsonl   each traced variant's summary (profile_summary.summarize)
  summary.json     the case, the device, versions, the ranking, the best variant
  hlo_baseline.txt.gz, trace_baseline.xplane.pb.gz   the baseline's optimized HLO and raw trace, so the
  hlo_best.txt.gz, trace_best.xplane.pb.gz           reduction can be redone off the GPU
  workers.log      each worker's command and stderr tail
A markdown table of the variants is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")
NOISE = 0.03  # a change must beat the baseline by more than this to count (run-to-run spread seen: 1-3%)

# name → (what it asks, train_step.py flags, XLA flags, same numerics as the baseline?)
# Same numerics: the same function of the same parameters (reassociation aside); the others change the
# model (dropout off) and are there to attribute time, never to be adopted as they are.
VARIANTS = {
    "baseline": (
        "the shipped config (layers a loop on GPUs), xla attention, dropout 0.1, fp32 params, bf16 compute",
        [],
        "",
        True,
    ),
    "torch": ("transformers' step on the same rows (SDPA, bf16 autocast, eager): the reference", [], "", True),
    "loop_layers": (
        "layers as a Python loop, not nn.scan (XLA:GPU copies stacked weights and gradients in a scan)",
        ["--override", "model.scan_layers=false"],
        "",
        True,
    ),
    # The loop's optimizer ran ~880 kernels a step on BERT-Large, ~820 of them under 10 µs (2.2 of its 3.95 ms):
    # a leaf per layer. Scanned and unrolled, the params stay stacked (a leaf per kind: 77 optimizer kernels
    # compiled for an H200) and no loop copies them; the checkpoint layout is the TPU's and CPU's.
    "scan_unrolled": (
        "nn.scan unrolled: no loop, each layer its own code, params and moments stacked (a leaf per kind)",
        ["--override", "model.scan_layers=true", "--override", "model.scan_unroll=0"],
        "",
        True,
    ),
    "cudnn": ("cuDNN fused attention (no attention-probability dropout)", ["--attention=cudnn"], "", False),
    "loop_cudnn": (
        "layers as a loop and cuDNN attention together: the candidate GPU default",
        ["--override", "model.scan_layers=false", "--attention=cudnn"],
        "",
        False,
    ),
    "no_dropout": (
        "dropout off everywhere: what the hash dropout and attention dropout cost",
        ["--override", "model.hidden_dropout_prob=0", "--override", "model.attention_probs_dropout_prob=0"],
        "",
        False,
    ),
    "cublas_gemm": ("matmuls in cuBLAS only, no Triton GEMM fusions", [], "--xla_gpu_enable_triton_gemm=false", True),
    "no_command_buffers": (
        "no CUDA graphs (command buffers) for fusions and library calls",
        [],
        "--xla_gpu_enable_command_buffer=",
        True,
    ),
    "latency_hiding": (
        "XLA:GPU's latency-hiding scheduler",
        [],
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        True,
    ),
    "bigger_batch": (
        "twice the rows a step: is the step bound by launches and syncs rather than work?",
        ["--batch_scale=2"],
        "",
        True,
    ),
    # The reductions (LayerNorm, softmax, the loss) took 15 of BERT-Base's 49 busy ms (loop, cuDNN), and the
    # GELU's forward 3.5 (it writes three [tokens, 3072] tensors: the output and two of erfc's intermediates for
    # the backward): keeping less for the backward, and XLA:GPU's other ways of fusing the reductions.
    "recompute_activation": (
        "the activation's backward recomputes it from the matmul's output: its forward writes one tensor, not three",
        ["--override", "model.recompute_activation=true"],
        "",
        True,
    ),
    "remat_dots": (
        "keep only matmul outputs for the backward, recompute the rest (GELU's erfc, LayerNorm, dropout) there",
        ["--override", "model.remat_policy=dots"],
        "",
        True,
    ),
    "block_level_fusions": (
        "normalisations and softmaxes as Triton block-level fusions",
        [],
        "--xla_gpu_experimental_enable_fusion_block_level_rewriter=true",
        True,
    ),
    "heroless_fusion": (
        "Triton fusions without a hero in the priority fusion pass",
        [],
        "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true",
        True,
    ),
    # A GPU default since 2026-11-28 (runtime/xla_flags.py: 1.06x BERT-Base's step): this variant turns it off.
    "no_cudnn_layer_norm": (
        "LayerNorm by XLA's fusions, not cuDNN's kernel",
        [],
        "--xla_gpu_enable_cudnn_layer_norm=false",
        True,
    ),
    "warp_specialization": (
        "Triton GEMMs with Hopper's warp specialisation",
        [],
        "--xla_gpu_experimental_enable_triton_warp_specialization=true",
        True,
    ),
    # ModernBERT: its sliding-window layers (2 of 3) spent 2/3 of the attention's 36 of 95 busy ms on keys
    # outside the window (the band as a bias). attention.windowed computes blocks of queries against the keys
    # their window reaches; on xla that is the default once a row holds six windows (measured on a CPU).
    "window_whole": (
        "ModernBERT's sliding layers as one attention over the row under a band (xla, window_block=0)",
        ["--override", "model.window_block=0"],
        "",
        True,
    ),
    "cudnn_window_blocks": (
        "the same on cuDNN: blocks of 64 queries, 192 keys",
        ["--attention=cudnn", "--override", "model.window_block=64"],
        "",
        False,
    ),
    "cudnn_window_blocks128": (
        "the same on cuDNN: blocks of 128 queries, 256 keys (fuller tiles, more masked work)",
        ["--attention=cudnn", "--override", "model.window_block=128"],
        "",
        False,
    ),
}
# --variants when not given: the questions still open for each family, the most telling first. Left out after
# gpu_compile.py compiled them for an H200 (benchmarks/results/gpu_compile): block_level_fusions (the same program
# as the baseline), heroless_fusion and remat_dots (more kernels and traffic: +2.4 ms at the bandwidth).
ORDERS = {
    "bert": (
        "baseline",
        "torch",
        "cudnn",
        "no_dropout",
        "no_cudnn_layer_norm",
        "warp_specialization",
        "latency_hiding",
        "combined",
        "bigger_batch",
    ),
    "modernbert": (
        "baseline",
        "cudnn",
        "cudnn_window_blocks",
        "cudnn_window_blocks128",
        "window_whole",
    ),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results directory (created; what the device run brings back)")
    p.add_argument("--case", default="bert:base:128:256", help="family:size:seq:batch")
    p.add_argument(
        "--variants", default="", help="comma-separated, run in this order (default: ORDERS of the case's family)"
    )
    p.add_argument(
        "--base",
        default="",
        help="train_step.py flags for every variant, the baseline's own (e.g. '--attention=cudnn'; a variant's win)",
    )
    p.add_argument("--budget_s", type=float, default=420.0, help="stop starting variants when this is spent")
    p.add_argument(
        "--variant_s",
        type=float,
        default=55.0,
        help="what one variant is expected to take (start, compile, time, trace): none starts with less left",
    )
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--xla_flags", default="", help="XLA flags for every variant (before the variant's own)")
    p.add_argument(
        "--dry_run",
        action="store_true",
        help="on the CPU: the case's family at its tiny size, 2 steps, every variant's code path (cudnn needs a GPU: skipped)",
    )
    return p.parse_args()


# --- One variant: train_step.py in a fresh process -------------------------------------------------------


def worker_command(args, name: str, case: dict, extra: list[str], profile_dir: str) -> list[str]:
    batch = case["batch"]
    extra = list(extra)
    if "--batch_scale=2" in extra:
        extra.remove("--batch_scale=2")
        batch *= 2
    frameworks = "torch" if name == "torch" else "jax"
    command = [
        sys.executable,
        os.path.join(HERE, "train_step.py"),
        f"--family={case['family']}",
        f"--sizes={case['size']}",
        f"--seq={case['seq']}",
        f"--batch={batch}",
        f"--frameworks={frameworks}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
    ]
    if frameworks == "jax":
        command.append(f"--profile_dir={profile_dir}")
        command.append("--attention=xla")  # unless --base or the variant says otherwise: the last one wins
        command += args.base.split()
    if args.dry_run:
        command.append("--no_peak")
    return command + extra


def run_variant(
    args, name: str, case: dict, extra: list[str], xla_flags: str, timeout: float, scratch: str, log
) -> tuple[dict, dict | None]:
    """(its row, its profile summary or None)."""
    profile_dir = os.path.join(scratch, name)
    command = worker_command(args, name, case, extra, profile_dir)
    env = dict(
        os.environ,
        XLA_FLAGS=" ".join(f for f in (args.xla_flags, xla_flags) if f),
        PYTHONUNBUFFERED="1",
        BERTJAX_NO_TCMALLOC="1",
    )  # the same allocator for every variant, and no re-exec in between
    if args.dry_run:
        env["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()
    try:
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
        returncode, stdout, stderr = run.returncode, run.stdout, run.stderr
    except subprocess.TimeoutExpired as e:
        returncode, stdout = -9, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (
            (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        ) + f"\ntimed out after {timeout:.0f}s"
    elapsed = time.perf_counter() - start
    log.write(
        f"=== {name} (exit {returncode}, {elapsed:.0f}s) XLA_FLAGS={env['XLA_FLAGS']!r}\n"
        f"{' '.join(command[1:])}\n{_tail(stderr, 40)}\n"
    )
    log.flush()
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    row = dict(variant=name, wall_s=round(elapsed, 1), xla_flags=xla_flags, flags=extra)
    if returncode or not rows:
        return dict(row, error=_error_line(stderr)), None
    out = rows[-1]
    prefix = "torch" if name == "torch" else "jax"
    row.update(
        step_s=out[f"{prefix}_step_s"],
        seq_per_s=out[f"{prefix}_seq_per_s"],
        mfu=out.get(f"{prefix}_mfu"),
        batch=out["batch"],
        device=out["device"],
        loss=out[f"{prefix}_loss"],
        pipelined_step_s=out.get(f"{prefix}_pipelined_step_s"),
        compile_s=out.get(f"{prefix}_compile_s"),
        init_s=out.get(f"{prefix}_init_s"),
        versions={k: out[k] for k in ("jax", "torch", "transformers") if k in out},
    )
    summary = None
    path = os.path.join(profile_dir, "profile.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = dict(json.load(f), variant=name)
    return row, summary


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()] or ["no output"]
    for line in reversed(lines):
        if any(w in line for w in ("Error", "error:", "Exception", "timed out", "Unknown flag", "RESOURCE_EXHAUSTED")):
            return line[:300]
    return lines[-1][:300]


# --- The matrix ---------------------------------------------------------------------------------------


def combined_variant(rows: dict[str, dict], baseline: dict) -> tuple[list[str], str, list[str]] | None:
    """Every same-numerics single change that beat the baseline by more than NOISE, together."""
    flags, xla, winners = [], [], []
    for name, row in rows.items():
        if name in ("baseline", "torch", "combined", "bigger_batch") or "step_s" not in row:
            continue
        if not VARIANTS[name][3]:
            continue
        if row["step_s"] < baseline["step_s"] * (1 - NOISE):
            winners.append(name)
            flags += VARIANTS[name][1]
            xla += [VARIANTS[name][2]] if VARIANTS[name][2] else []
    return (flags, " ".join(xla), winners) if winners else None


def keep_artifacts(out: str, label: str, scratch: str, name: str) -> None:
    """hlo_<label>.txt.gz and trace_<label>.xplane.pb.gz from a variant's scratch directory."""
    source = os.path.join(scratch, name)
    if os.path.exists(os.path.join(source, "hlo.txt.gz")):
        shutil.copy(os.path.join(source, "hlo.txt.gz"), os.path.join(out, f"hlo_{label}.txt.gz"))
    traces = [
        os.path.join(d, f)
        for d, _, fs in os.walk(os.path.join(source, "trace"))
        for f in fs
        if f.endswith(".xplane.pb")
    ]
    if traces:
        with open(traces[0], "rb") as src, gzip.open(os.path.join(out, f"trace_{label}.xplane.pb.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        if os.path.getsize(os.path.join(out, f"trace_{label}.xplane.pb.gz")) > 15 * 2**20:
            os.remove(os.path.join(out, f"trace_{label}.xplane.pb.gz"))  # over what comes back: the summary has it


def device_info() -> dict:
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    return dict(nvidia_smi=smi or None, python=platform.python_version(), cpu_count=os.cpu_count())


def markdown(rows: list[dict], baseline_step: float | None) -> str:
    lines = [
        "| variant | step ms | pipelined ms | seq/s | MFU | vs baseline | top category (share) | idle ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "step_s" not in r:
            lines.append(f"| {r['variant']} | {r.get('error') or r.get('skipped', '?')} |" + " — |" * 6)
            continue
        ratio = f"{baseline_step / r['step_s']:.2f}×" if baseline_step else "—"
        top = r.get("top_category") or "—"
        pipelined = f"{r['pipelined_step_s'] * 1e3:.1f}" if r.get("pipelined_step_s") else "—"
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "—"
        idle = f"{r['idle_ms']:.1f}" if r.get("idle_ms") is not None else "—"
        lines.append(
            f"| {r['variant']} | {r['step_s'] * 1e3:.1f} | {pipelined} | {r['seq_per_s']:,.0f} | {mfu} | "
            f"{ratio} | {top} | {idle} |"
        )
    return "\n".join(lines)


def main():
    args = parse_args()
    family, size, seq, batch = args.case.split(":")
    case = dict(family=family, size=size, seq=int(seq), batch=int(batch))
    if args.dry_run:
        case.update(size="tiny", batch=min(int(batch), 8))  # the CPU's rows: at most 8 (fewer where the case asks)
        args.steps, args.warmup = 2, 1
    names = [n.strip() for n in args.variants.split(",") if n.strip()] or list(ORDERS[family])
    unknown = set(names) - set(VARIANTS) - {"combined"}
    if unknown:
        raise SystemExit(f"--variants: {sorted(unknown)} unknown; choose from {', '.join(VARIANTS)}, combined.")
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="gpu_profile_")
    start = time.perf_counter()
    rows: dict[str, dict] = {}
    profiles: dict[str, dict] = {}
    with open(os.path.join(args.out, "workers.log"), "a") as log:
        for name in names:
            left = args.budget_s - (time.perf_counter() - start)
            if name == "combined":
                baseline = rows.get("baseline", {})
                made = combined_variant(rows, baseline) if "step_s" in baseline else None
                if made is None:
                    rows[name] = dict(variant=name, skipped="no same-numerics change beat the baseline")
                    continue
                flags, xla, winners = made
                VARIANTS["combined"] = (f"together: {', '.join(winners)}", flags, xla, True)
            if left < args.variant_s:
                rows[name] = dict(variant=name, skipped=f"budget spent ({left:.0f}s left)")
                continue
            if args.dry_run and "--attention=cudnn" in VARIANTS[name][1] + args.base.split():
                rows[name] = dict(variant=name, skipped="needs a GPU (dry run)")
                continue
            what, extra, xla, _ = VARIANTS[name]
            print(f"gpu_profile: {name}: {what} ({left:.0f}s of the budget left)", file=sys.stderr, flush=True)
            # At most three variants' time each: one that compiles for minutes (the unrolled init did, ~200 s
            # on an H200) is stopped and reported, and the rest still run.
            timeout = max(args.variant_s, min(left + 60, 3 * args.variant_s))
            row, summary = run_variant(args, name, case, extra, xla, timeout, scratch, log)
            row["asks"] = what
            if summary:
                profiles[name] = summary
                row.update(
                    busy_ms=summary.get("busy_ms_per_step"),
                    idle_ms=summary.get("idle_ms_per_step"),
                    top_category=next(iter(summary["categories"]), None),
                )
            rows[name] = row
            print(
                f"gpu_profile: {name}: "
                + (f"{row['step_s'] * 1e3:.1f} ms a step" if "step_s" in row else row.get("error", "?")),
                file=sys.stderr,
                flush=True,
            )
    baseline = rows.get("baseline", {})
    base_step = baseline.get("step_s")
    for row in rows.values():
        if base_step and "step_s" in row:
            row["vs_baseline"] = round(base_step / row["step_s"], 4)
    timed = [
        r
        for n, r in rows.items()
        if "step_s" in r and n != "torch" and VARIANTS.get(n, (0, 0, 0, True))[3] and n != "bigger_batch"
    ]
    best = min(timed, key=lambda r: r["step_s"] / (r["batch"] / case["batch"])) if timed else None
    keep_artifacts(args.out, "baseline", scratch, "baseline")
    if best and best["variant"] != "baseline":
        keep_artifacts(args.out, "best", scratch, best["variant"])
    with open(os.path.join(args.out, "variants.jsonl"), "a") as f:
        for row in rows.values():
            f.write(json.dumps(dict(row, case=case, date=datetime.date.today().isoformat())) + "\n")
    with open(os.path.join(args.out, "profiles.jsonl"), "a") as f:
        for summary in profiles.values():
            f.write(json.dumps(dict(summary, case=case)) + "\n")
    torch_step = rows.get("torch", {}).get("step_s")
    summary = dict(
        case=case,
        date=datetime.date.today().isoformat(),
        dry_run=args.dry_run,
        device=baseline.get("device"),
        versions=baseline.get("versions"),
        host=device_info(),
        elapsed_s=round(time.perf_counter() - start, 1),
        baseline_step_s=base_step,
        torch_step_s=torch_step,
        best=best
        and dict(
            variant=best["variant"],
            step_s=best["step_s"],
            mfu=best.get("mfu"),
            vs_baseline=best.get("vs_baseline"),
            vs_torch=torch_step and round(torch_step / best["step_s"], 4),
        ),
        ranking=[
            dict(variant=r["variant"], step_s=r["step_s"], vs_baseline=r.get("vs_baseline"))
            for r in sorted((r for r in rows.values() if "step_s" in r), key=lambda r: r["step_s"])
        ],
    )
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(summary))
    print(f"\n{summary['device']}, {args.case}{f' (dry run: {family}-tiny on the CPU)' if args.dry_run else ''}:\n")
    print(markdown(list(rows.values()), base_step))


if __name__ == "__main__":
    main()
