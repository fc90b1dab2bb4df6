"""Which TPU slice fits BERT-Base and BERT-Large pre-training, and with what settings: compiled, not guessed.

    python benchmarks/tpu_fit.py [--models=base,large] [--phases=128:4096,128:65536,512:4096,512:32768]
                                 [--slices=v4-8,v5e-16,v5e-256,v5p-8,v6e-8] [--results=FILE] [--markdown]
    python benchmarks/tpu_fit.py --models=modernbert-base,modernbert-large --phases=1024:4608,8192:576
    python benchmarks/tpu_fit.py --slices=8xH100,8xH200     # GPU nodes: jax's CUDA plugin (bertjax[cuda13])

`modernbert-SIZE` is configs/modernbert.py:size=SIZE (packed rows, 30% masking: int(0.3 · seq) + 1
predictions a sequence) with splash attention, whose sliding window skips the blocks outside it.

For every (model, phase, slice) case the script runs the job's own `python -m bertjax.main
--compile_only --topology=…` (libtpu compiles the real bf16 train step, no TPUs needed; see bertjax/training/aot.py)
and searches for the cheapest settings that fit, trying in this order and stopping at the first fit:

  1. data parallelism (mesh (-1,1,1)), no rematerialisation, then the fewest micro-batches that fit;
  2. the same with remat_policy=full (recompute each layer: ~1/3 more FLOPs, far fewer activations);
  3. the same two with the state fully sharded (fsdp: mesh (1,-1,1)).

Micro-batches are estimated from what the last attempt needed (libtpu's out-of-memory report: activations
scale with the rows a micro-batch holds), doubled until the step fits, then narrowed down to the fewest
power of two that fits (the next count predicted from the memory of two compiles, else the half); a
setting whose micro-batch would hold less than one row per device is skipped. Where a power of two does
not split the batch over the devices (576 rows on 16 chips), the fewest count above it that does is
compiled instead (9), and narrowed down the same way over the counts that do (6). A larger batch starts from
what a smaller one of the same case needed (k times the batch, k times the micro-batches), so most
65,536 / 32,768 cases cost one or two compiles.
Phases: `SEQ:GLOBAL_BATCH`, with 20 predictions at seq 128 and 80 at 512 (BERT's). Models are
configs/<model>.py as users get them (xla attention with BERT's dropout) in bfloat16.

Each attempt is one JSON line appended to --results (default benchmarks/results/tpu_fit.jsonl), so an
interrupted search resumes where it stopped. The script prints one JSON row per case (`fits`, the
settings, per-device GiB, FLOPs per step, the attempts it took) and, with --markdown, the README's table.
Compiles of BERT-Large take minutes each on a 2-core machine: run it in the background.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Cloud TPU accelerator types → topologies (chips per dimension). v4 and v5p count TensorCores in the
# name, two a chip: v4-8 is 4 chips.
SLICES = {"v4-8": "v4:2x2x1", "v5e-16": "v5e:4x4", "v5e-256": "v5e:16x16", "v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4"}
# GPU nodes (not searched unless named in --slices): 8 GPUs on one host, compiled by jax's CUDA plugin; judged
# against the memory JAX's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set).
GPU_NODES = {"8xA100": "a100:8", "8xH100": "h100:8", "8xH200": "h200:8"}
PREDICTIONS = {128: 20, 512: 80}
MESHES = {"data": "(-1,1,1)", "fsdp": "(1,-1,1)"}
PLANS = (("data", "none"), ("data", "full"), ("fsdp", "none"), ("fsdp", "full"))
GIB = 2**30


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="base,large")
    p.add_argument("--phases", default="128:4096,128:65536,512:4096,512:32768", help="SEQ:GLOBAL_BATCH list")
    p.add_argument("--slices", default=",".join(SLICES), help=f"of {', '.join(SLICES)}; GPUs: {', '.join(GPU_NODES)}")
    p.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results", "tpu_fit.jsonl"))
    p.add_argument("--timeout", type=int, default=1800, help="seconds per compile")
    p.add_argument("--markdown", action="store_true", help="also print the README's markdown table")
    p.add_argument(
        "--cached_only",
        action="store_true",
        help="compile nothing: report what --results already holds (unsearched cases say so)",
    )
    return p.parse_args()


def config_file(model: str) -> str:
    """configs/<model>.py, or configs/modernbert.py:size=SIZE for modernbert-SIZE."""
    if model.startswith("modernbert-"):
        return os.path.join(ROOT, "configs", "modernbert.py") + ":size=" + model.split("-", 1)[1]
    return os.path.join(ROOT, "configs", model + ".py")


def topology(slice_name: str) -> str:
    return GPU_NODES[slice_name] if slice_name in GPU_NODES else SLICES[slice_name]


def predictions(model: str, seq: int) -> int:
    """BERT's 20 at seq 128 and 80 at 512; ModernBERT's 30% masking."""
    return int(0.3 * seq) + 1 if model.startswith("modernbert-") else PREDICTIONS[seq]


def _key(model, seq, batch, slice_name, mesh, remat, micro) -> str:
    return f"{model}|{seq}|{batch}|{slice_name}|{mesh}|{remat}|{micro}"


def attempt(
    args, done: dict, model: str, seq: int, batch: int, slice_name: str, mesh: str, remat: str, micro: int
) -> dict:
    """One compile by the job's CLI (or its earlier result from --results)."""
    key = _key(model, seq, batch, slice_name, mesh, remat, micro)
    if key in done:
        return done[key]
    if args.cached_only:
        raise LookupError(key)
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable,
            "-m",
            "bertjax.main",
            f"--config={config_file(model)}",
            f"--workdir={workdir}",
            "--compile_only",
            f"--topology={topology(slice_name)}",
            "--config.model.dtype=bfloat16",
            f"--config.data.max_seq_length={seq}",
            f"--config.data.max_predictions_per_seq={predictions(model, seq)}",
            f"--config.train.global_batch_size={batch}",
            f"--config.mesh.shape={MESHES[mesh]}",
            f"--config.model.remat_policy={remat}",
            f"--config.train.micro_batches={micro}",
        ]
        if model.startswith("modernbert-"):  # the fused kernel that skips the window's blocks; cuDNN on GPUs
            command.append("--config.model.attention=" + ("cudnn" if slice_name in GPU_NODES else "splash"))
        start = time.time()
        try:
            run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
            error = "" if run.returncode == 0 else run.stderr.strip().splitlines()[-1][:400]
        except subprocess.TimeoutExpired:
            run, error = None, f"compile timed out after {args.timeout}s"
        path = os.path.join(workdir, "compile_report.json")
        report = json.load(open(path)) if os.path.exists(path) else None
    row = dict(
        key=key,
        model=model,
        seq=seq,
        global_batch_size=batch,
        slice=slice_name,
        mesh=mesh,
        remat=remat,
        micro_batches=micro,
        compile_s=round(time.time() - start, 1),
        report=report,
        error=None if report else error,
    )
    if run is not None:  # a compile that timed out says nothing about fitting: not cached, tried again next time
        with open(args.results, "a") as f:
            f.write(json.dumps(row) + "\n")
        done[key] = row
    print(
        f"  {key}: {'fits' if report and report['fits'] else 'no'} ({row['compile_s']}s)"
        f"{'' if report else ' ' + error}",
        file=sys.stderr,
        flush=True,
    )
    return row


def micro_batches_needed(report: dict, micro: int, limit: int) -> int:
    """The next micro-batch count to try: what the activations of the last attempt say, as a power of 2."""
    room = report.get("compiler_available_bytes") or 0.95 * report["hbm_bytes_per_device"]
    room -= report["argument_bytes"] + report["code_bytes"]
    if room <= 0:
        return limit * 2  # the state alone does not fit: no micro-batching helps
    needed = micro * report["temp_bytes"] / room
    return min(max(2 * micro, 2 ** math.ceil(math.log2(max(needed, 1)))), limit * 2)


def seed_from_smaller_batches(
    done: dict, model: str, seq: int, batch: int, slice_name: str, mesh: str, remat: str
) -> tuple[int, int]:
    """(micro-batches to try first, the most known not to fit) for `batch`, from smaller batches' compiles.

    A step's memory is the state (the same at any batch) plus a micro-batch's activations, so a batch k
    times larger needs k times the micro-batches of a smaller one at the same settings (the batch itself,
    a few MB per device, is the only growth): its fit starts k × the smaller fit, and k × a count that
    did not fit cannot fit either.
    """
    fits, too_few = [], 0
    for row in done.values():
        smaller, report = row["global_batch_size"], row["report"]
        if (
            (row["model"], row["seq"], row["slice"], row["mesh"], row["remat"]) != (model, seq, slice_name, mesh, remat)
            or smaller >= batch
            or batch % smaller
            or report is None
        ):
            continue
        scaled = row["micro_batches"] * batch // smaller
        if report["fits"]:
            fits.append(scaled)
        else:
            too_few = max(too_few, scaled)
    return (min(fits) if fits else max(1, 2 * too_few)), too_few


def predicted_fewest(reports: list[dict]) -> Optional[float]:
    """The fewest micro-batches that fit, from two or more compiles at different counts: per-device memory
    is close to `a + b / micro` (the state, plus activations of fewer rows per micro-batch). None: fewer
    than two compiles, or memory that does not follow the line."""
    points = {r["micro_batches"]: r["total_bytes"] for r in reports}
    if len(points) < 2:
        return None
    x = [1 / m for m in points]  # least squares of total bytes on 1 / micro
    x_mean, t_mean = sum(x) / len(x), sum(points.values()) / len(x)
    b = sum((xi - x_mean) * (t - t_mean) for xi, t in zip(x, points.values())) / sum((xi - x_mean) ** 2 for xi in x)
    a = t_mean - b * x_mean
    limit = min(r.get("compiler_available_bytes") or r["hbm_bytes_per_device"] for r in reports)
    if b <= 0 or a >= limit:
        return None
    return max(b / (limit - a), 1)


def next_probe(reports: list[dict], too_few: int, fits: int) -> int:
    """The next micro-batch count to compile, a power of two in (too_few, fits/2]: with two compiles at
    different counts the predicted fewest that fits is tried first, so that a search from a generous count
    does not compile every halving (each fitting compile of a large model takes minutes). Otherwise, and
    when the prediction lies outside the range, the half."""
    half = fits // 2
    predicted = predicted_fewest(reports)
    if predicted is None:
        return half
    return min(max(2 ** math.ceil(math.log2(predicted)), 2 * too_few, 1), half)


def splitting_counts(batch: int, devices: int) -> list[int]:
    """Micro-batch counts whose micro-batches split evenly over the devices, at least a row each."""
    return [c for c in range(1, batch // devices + 1) if batch % (c * devices) == 0]


def next_splitting_count(target: int, batch: int, devices: int) -> Optional[int]:
    """`target` (a power of two) when it splits the batch, else the fewest counts above it that do: a batch
    of 576 on 16 chips takes 1, 2, 3, 4, 6, 9, 12, 18 or 36 micro-batches, never 8. None: nothing does."""
    return next((c for c in splitting_counts(batch, devices) if c >= target), None)


def narrower_splitting_count(reports: list[dict], too_few: int, fits: int, batch: int, devices: int) -> int:
    """After a fit at a count that is no power of two: the next count below it to compile, one that splits
    the batch, above the most known not to fit: the fewest at or above the prediction, else the middle one."""
    below = [c for c in splitting_counts(batch, devices) if too_few < c < fits]
    predicted = predicted_fewest(reports)
    if predicted is None:
        return below[len(below) // 2]
    return next((c for c in below if c >= predicted), below[-1])


def search(args, done: dict, model: str, seq: int, batch: int, slice_name: str) -> dict:
    tried = []
    for mesh, remat in PLANS:
        # too_few: the most micro-batches known not to fit
        micro, too_few = seed_from_smaller_batches(done, model, seq, batch, slice_name, mesh, remat)
        while True:
            row = attempt(args, done, model, seq, batch, slice_name, mesh, remat, micro)
            tried.append(row)
            report = row["report"]
            if report is None:
                break  # an error other than memory: next plan
            if report["fits"]:
                # The estimate may overshoot: narrow down to the fewest power of two above a known failure
                # (or, where a power of two could not split the batch, the fewest count that does).
                devices = report["num_devices"]
                while (
                    micro // 2 > too_few
                    if micro & (micro - 1) == 0
                    else any(too_few < c < micro for c in splitting_counts(batch, devices))
                ):
                    reports = [r["report"] for r in tried if r["report"] and r["mesh"] == mesh and r["remat"] == remat]
                    probe = (
                        next_probe(reports, too_few, micro)
                        if micro & (micro - 1) == 0
                        else narrower_splitting_count(reports, too_few, micro, batch, devices)
                    )
                    row = attempt(args, done, model, seq, batch, slice_name, mesh, remat, probe)
                    tried.append(row)
                    if row["report"] and row["report"]["fits"]:
                        micro, report = probe, row["report"]
                    else:
                        too_few = probe
                return dict(_summary(model, seq, batch, slice_name, report), attempts=len(tried))
            too_few = micro
            limit = batch // report["num_devices"]  # at least one row per device per micro-batch
            micro = micro_batches_needed(report, micro, limit)
            if micro > limit:
                break
            micro = next_splitting_count(micro, batch, report["num_devices"])
            if micro is None:
                break
    last = next((r["report"] for r in reversed(tried) if r["report"]), None)
    return dict(
        _summary(model, seq, batch, slice_name, last)
        if last
        else dict(model=model, seq=seq, global_batch_size=batch, slice=slice_name),
        fits=False,
        attempts=len(tried),
        errors=sorted({r["error"] for r in tried if r["error"]}),
    )


def _summary(model: str, seq: int, batch: int, slice_name: str, report: dict) -> dict:
    return dict(
        model=model,
        seq=seq,
        global_batch_size=batch,
        slice=slice_name,
        topology=report["topology"],
        devices=report["num_devices"],
        fits=report["fits"],
        mesh=report["mesh"],
        remat_policy=report["remat_policy"],
        micro_batches=report["micro_batches"],
        gib_per_device=round(report["total_bytes"] / GIB, 2),
        hbm_gib=round(report["hbm_bytes_per_device"] / GIB),
        flops_per_step=report["flops_per_step"],
    )


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | seq × global batch | slice | fits | mesh (data, fsdp, tensor) | remat | micro-batches | "
        "GiB / device (HBM) | TFLOPs / step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mesh = ", ".join(str(v) for v in r["mesh"].values()) if r.get("mesh") else "—"
        flops = f"{r['flops_per_step'] / 1e12:,.0f}" if r.get("flops_per_step") else "—"
        fits = {True: "yes", False: "**no**", None: "not compiled yet"}[r["fits"]]
        gib = f"{r['gib_per_device']} ({r['hbm_gib']})" if "gib_per_device" in r else "—"
        lines.append(
            f"| {r['model']} | {r['seq']} × {r['global_batch_size']:,} | {r['slice']} | {fits} | {mesh} | "
            f"{r.get('remat_policy', '—')} | {r.get('micro_batches', '—')} | {gib} | {flops} |"
        )
    return "\n".join(lines)


def main():
    args = parse_args()
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    done = {}
    if os.path.exists(args.results):
        for line in open(args.results):
            row = json.loads(line)
            done[row["key"]] = row
    rows = []
    for model in args.models.split(","):
        for phase in args.phases.split(","):
            seq, batch = (int(x) for x in phase.split(":"))
            for slice_name in args.slices.split(","):
                try:
                    row = search(args, done, model, seq, batch, slice_name)
                except LookupError:  # --cached_only and this case's search is not finished
                    row = dict(model=model, seq=seq, global_batch_size=batch, slice=slice_name, fits=None)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
