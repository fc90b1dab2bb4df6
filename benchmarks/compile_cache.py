"""The compilation cache (bertjax/runtime/compile_cache.py): the same job command twice, each in a fresh workdir and
process, against an empty cache folder: the first compiles its train step, the second loads it.

    python benchmarks/compile_cache.py [--layers=12] [--hidden=768] [--steps=3]

The job is `make demo`'s (configs/demo.py:quick, builtin:pydocs, seq 64), its model widened to --hidden and
--layers (BERT-Base's size by default), batch 8. Prints one JSON object: the seconds each process logged for its
train step (`compile: train step compiled in …` / `… loaded from the compilation cache in …`), their ratio, each
process's wall seconds, and the cache's size on disk.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bertjax.runtime import compile_cache  # noqa: E402  (where a job keeps its programs, for their size)

LINE = re.compile(r"compile: train step (compiled|loaded from the compilation cache) in ([0-9.]+)s")


def run_job(workdir: str, cache: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "BERTJAX_COMPILATION_CACHE")}
    env.update(BERTJAX_CACHE_DIR=cache, JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"))
    heads = max(1, args.hidden // 64)
    command = [
        sys.executable,
        "-m",
        "bertjax.main",
        f"--workdir={workdir}",
        "--config=configs/demo.py:quick",
        f"--config.model.hidden_size={args.hidden}",
        f"--config.model.num_hidden_layers={args.layers}",
        f"--config.model.num_attention_heads={heads}",
        f"--config.model.intermediate_size={4 * args.hidden}",
        "--config.train.global_batch_size=8",
        f"--config.train.num_train_steps={args.steps}",
        "--config.optim.warmup_steps=1",
        f"--config.eval.every_steps={args.steps}",
        "--config.eval.num_batches=1",  # the held-out pass is not what is measured
        "--config.eval.show_predictions=0",
        f"--config.checkpoint.every_steps={args.steps}",
        "--config.data.dupe_factor=1",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    found = LINE.search(done.stderr)
    if not found:
        raise SystemExit(f"no 'compile: train step …' line in the job's log:\n{done.stderr[-3000:]}")
    return {
        "how": "loaded" if found.group(1) != "compiled" else "compiled",
        "step_s": float(found.group(2)),
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as base:
        cache = os.path.join(base, "cache")
        first = run_job(os.path.join(base, "first"), cache, args)
        second = run_job(os.path.join(base, "second"), cache, args)
        folder = compile_cache.default_dir({"BERTJAX_CACHE_DIR": cache})
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    print(
        json.dumps(
            {
                "model": {"layers": args.layers, "hidden": args.hidden, "seq": 64, "batch": 8},
                "first": first,
                "second": second,
                "compile_vs_load": round(first["step_s"] / second["step_s"], 2),
                "cache_mib": round(size / 2**20, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
