"""`make demo`'s output as it is today, kept in benchmarks/results/demo.txt: the README's demo block and
docs/demo.md quote it, and tests/test_docs.py checks every figure they quote against it.

    python benchmarks/demo_transcript.py [--log=FILE]

Without --log it runs what `make demo` runs (the job, then the fine-tuning comparison) into a fresh workdir/demo
and records their output; with --log it reads the output of a `make demo` already run (`make demo 2>&1 | tee F`).
The log lines lose their absl prefix (level, time, thread, file:line): the transcript is what a person reads.
Prints one JSON line: the file written, its lines, the held-out MLM/NSP accuracy and the fine-tuned dev accuracy.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "demo.txt"
COMMANDS = (
    ["-m", "bertjax.main", "--config=configs/demo.py", "--workdir=workdir/demo"],
    [
        "-m",
        "bertjax.demo_finetune",
        "--config=configs/demo_finetune.py",
        "--pretrained=workdir/demo",
        "--workdir=workdir/demo/finetune",
    ],
)
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")


def transcript(log: str) -> list[str]:
    """The log's lines without absl's prefixes, make's own lines and blank lines; paths relative to the clone."""
    lines = []
    for line in log.splitlines():
        line = ABSL_PREFIX.sub("", line.rstrip()).replace(f"{ROOT}{os.sep}", "")
        if line and not line.startswith(("make", "rm -rf", ".venv/bin/python")):
            lines.append(line)
    return lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def run_demo() -> str:
    shutil.rmtree(ROOT / "workdir" / "demo", ignore_errors=True)
    out = []
    for command in COMMANDS:
        done = subprocess.run(
            [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ)
        )
        out.append(done.stderr + done.stdout)
        if done.returncode:
            raise SystemExit(f"demo_transcript: {' '.join(command)} failed (rc {done.returncode}):\n{out[-1][-3000:]}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", help="the output of a `make demo` already run, instead of running it")
    args = p.parse_args()
    log = pathlib.Path(args.log).read_text(encoding="utf-8") if args.log else run_demo()
    lines = transcript(log)
    header = f"# make demo, {datetime.date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} cores (benchmarks/demo_transcript.py; the README and docs/demo.md quote it)"
    OUT.write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    final = [line for line in lines if line.startswith("eval  step") and "mlm_acc" in line][-1]
    tuned = [line for line in lines if line.strip().startswith("pretrained")]
    print(json.dumps({"file": str(OUT.relative_to(ROOT)), "lines": len(lines), "final_eval": final, "tuned": tuned}))


if __name__ == "__main__":
    main()
