"""bf16 against fp32 on the demo's settings and data: held-out accuracy after the same steps.

    python benchmarks/bf16.py [--steps=2000] [--workdir=DIR]

Runs the job itself (`train.train_and_evaluate`) on configs/demo.py twice, `config.model.dtype` float32
then bfloat16, for --steps steps each: the first run makes the vocab and records from `builtin:pydocs`,
the second trains on the very same records. Prints one JSON object:

  {"steps": …, "float32": {...}, "bfloat16": {...}, "mlm_accuracy_difference": bf16 − fp32 (points)}

with, for each: the held-out `mlm_accuracy` / `nsp_accuracy` at the end, their baselines, and the median
`seq_per_s` (on a CPU bf16 is emulated: its speed says nothing about an accelerator's).
"""

import argparse
import json
import os
import runpy
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(dtype: str, steps: int, workdir: str, data: str = "") -> dict:
    from bertjax.jobs import main as train

    c = runpy.run_path(os.path.join(ROOT, "configs", "demo.py"))["get_config"]()
    c.model.dtype = dtype
    c.train.num_train_steps = steps
    c.checkpoint.update(every_steps=steps, export_hf=False)
    c.eval.update(every_steps=steps, show_predictions=0)
    if data:  # the first run's records and vocab
        c.data.update(
            corpus="",
            train_files=os.path.join(data, "train", "*.tfrecord"),
            eval_files=os.path.join(data, "heldout", "*.tfrecord"),
            vocab_file=os.path.join(data, "vocab", "vocab.txt"),
        )
        with open(c.data.vocab_file) as f:
            c.model.vocab_size = sum(1 for _ in f)
    shutil.rmtree(workdir, ignore_errors=True)
    final = train.train_and_evaluate(c, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    timed = [r["seq_per_s"] for r in rows if r["kind"] == "train" and r.get("seq_per_s")][1:]
    return dict(
        mlm_accuracy=final["mlm_accuracy"],
        nsp_accuracy=final["nsp_accuracy"],
        mlm_accuracy_baseline=final["mlm_accuracy_baseline"],
        nsp_accuracy_baseline=final["nsp_accuracy_baseline"],
        seq_per_s=statistics.median(timed) if timed else None,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--workdir", default="", help="keep the runs here (default: a temporary directory)")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import jax

    root = args.workdir or tempfile.mkdtemp(prefix="bertjax-bf16-")
    fp32 = run("float32", args.steps, os.path.join(root, "float32"))
    bf16 = run("bfloat16", args.steps, os.path.join(root, "bfloat16"), data=os.path.join(root, "float32", "data"))
    print(
        json.dumps(
            {
                "steps": args.steps,
                "float32": fp32,
                "bfloat16": bf16,
                "mlm_accuracy_difference": 100 * (bf16["mlm_accuracy"] - fp32["mlm_accuracy"]),
                "jax": jax.__version__,
                "backend": jax.default_backend(),
                "cpu_count": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
