"""Which directories are bertjax's to write into, checked before any work starts.

bertjax writes into a directory a user names (a job's --workdir, an export's --output_dir) only when it is
new, empty, or one bertjax made: a made directory holds MARKER (`.bertjax.json`, the first file written).
A job's workdir without it may still hold files of other names (a log the user redirected there); it is
refused when it holds a directory or a file of a name bertjax writes (config.json, metrics.jsonl, …), which
a job would overwrite, append to or read as its own: an HF Trainer's output, another tool's checkpoints.
An export's --output_dir without it must be empty: left-over model files change what transformers loads
(a stale tokenizer.json is preferred to the exported vocab.txt). Re-exporting into an export bertjax wrote
first removes the files the marker lists, so nothing of the old export survives beside the new one; files a
user added there since are kept.

Workdirs of earlier bertjax versions, which carry no marker, are recognised by their own files (a job
config.json, the data stage's record, a GLUE report, or such runs one or two levels down) and adopted.

The same rules hold in an object store (gs://): every check goes through the one file layer (runtime/files.py),
where a "directory" is a prefix that holds objects.
"""

from __future__ import annotations

import json
import os
import time
from typing import Iterable, Optional

from bertjax.runtime import files

MARKER = ".bertjax.json"
# Names a job writes at the top of its workdir (pre-training, fine-tuning, the GLUE suite, the demo); a
# test holds this list to what the jobs write. Not job.lock: the lock (lock.py) judges a lock file itself.
WORKDIR_FILES = (
    "config.json",
    "metrics.jsonl",
    "compile_report.json",
    "labels.json",
    "eval_predictions.jsonl",
    "sweep.json",
    "glue.json",
    "glue.md",
    "glue_run.json",
    "scores.json",
    "scores.md",
)
EVENTS_PREFIX = "events.out.tfevents."


def read_marker(directory: str) -> Optional[dict]:
    try:
        marker = files.read_json(os.path.join(directory, MARKER))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def write_marker(directory: str, kind: str, written: Iterable[str] = ()) -> None:
    files.makedirs(directory)
    marker = {"made_by": "bertjax", "kind": kind, "time": round(time.time(), 3)}
    if kind == "export":
        marker["files"] = sorted(written)
    files.write_whole(os.path.join(directory, MARKER), json.dumps(marker, indent=1))


def _legacy_workdir(directory: str, depth: int = 2) -> bool:
    """A workdir an earlier bertjax wrote (no marker): its job config.json, the data stage's record, a GLUE
    report; or a directory of such runs (a sweep, the demo, a GLUE task), `depth` levels down."""
    try:
        config = files.read_json(os.path.join(directory, "config.json"))
        if isinstance(config, dict) and (
            {"model", "train", "data"} <= config.keys() or config.get("kind") == "finetune"
        ):
            return True
    except (OSError, ValueError):
        pass
    if any(files.isfile(os.path.join(directory, *name)) for name in (("data", "stage.json"), ("glue.json",))):
        return True
    return depth > 0 and any(
        _legacy_workdir(os.path.join(directory, n), depth - 1)
        for n in files.listdir(directory)
        if files.isdir(os.path.join(directory, n))
    )


def _written_by_a_job(name: str, path: str) -> bool:
    return name in WORKDIR_FILES or name.startswith(EVENTS_PREFIX) or files.isdir(path)


def claim_workdir(workdir: str, flag: str = "--workdir", primary: bool = True) -> None:
    """Refuses a workdir holding what bertjax did not write, before anything is written; then marks it (on the
    primary process: every process checks, one writes)."""
    files.check_bucket(workdir, flag)
    if files.isfile(workdir):
        raise NotADirectoryError(f"{flag}={workdir} is a file, not a directory; pass a new or empty directory.")
    if files.isdir(workdir) and read_marker(workdir) is None and not _legacy_workdir(workdir):
        foreign = sorted(
            n + ("/" if files.isdir(os.path.join(workdir, n)) else "")
            for n in files.listdir(workdir)
            if _written_by_a_job(n, os.path.join(workdir, n))
        )
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise FileExistsError(
                f"{flag}={workdir} holds {shown}, which bertjax did not write (it has no {MARKER}) and a job would "
                "overwrite or read as its own; nothing was changed. Pass a new or empty directory."
            )
    if primary and read_marker(workdir) is None:
        write_marker(workdir, "workdir")


def _earlier_export(output_dir: str, inside_own_workdir: bool) -> list[str]:
    """The files an earlier bertjax export left in output_dir; refuses files bertjax did not write.
    `inside_own_workdir`: WORKDIR/hf of a bertjax workdir, whose files an earlier bertjax export wrote even
    without a marker."""
    files.check_bucket(output_dir, "--output_dir")
    if files.isfile(output_dir):
        raise NotADirectoryError(
            f"--output_dir={output_dir} is a file, not a directory; pass a new or empty "
            "directory for the Hugging Face files."
        )
    if not files.isdir(output_dir):
        return []
    marker = read_marker(output_dir)
    present = sorted(n for n in files.listdir(output_dir) if n != MARKER)
    if marker is not None and marker.get("kind") == "export":
        return [n for n in marker.get("files", []) if os.path.basename(n) == n]
    if present and not inside_own_workdir:
        shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise FileExistsError(
            f"--output_dir={output_dir} already holds {shown}, which bertjax did not write; left-over model files "
            "would change what transformers loads, so nothing was written. Pass a new or empty directory."
        )
    return [n for n in present if files.isfile(os.path.join(output_dir, n))]


def check_export_dir(output_dir: str, inside_own_workdir: bool = False) -> None:
    """Before an export reads anything: refuses an output_dir holding files bertjax did not write."""
    _earlier_export(output_dir, inside_own_workdir)


def clear_earlier_export(output_dir: str, inside_own_workdir: bool = False, keep: Iterable[str] = ()) -> list[str]:
    """Just before an export writes: removes what an earlier export there wrote (the marker's list), except
    `keep` (a vocab file the new export copies from there); returns the files left, the user's own."""
    keep_real = {files.resolved(k) for k in keep if k}
    for name in _earlier_export(output_dir, inside_own_workdir):
        path = os.path.join(output_dir, name)
        if files.isfile(path) and files.resolved(path) not in keep_real:
            files.remove(path)
    return [n for n in files.listdir(output_dir) if n != MARKER]


def finish_export(output_dir: str, before: Iterable[str]) -> None:
    """Marks output_dir as an export, listing the files it wrote (those not in `before`, what
    clear_earlier_export left)."""
    kept = set(before)
    written = [
        n
        for n in files.listdir(output_dir)
        if n != MARKER and n not in kept and files.isfile(os.path.join(output_dir, n))
    ]
    write_marker(output_dir, "export", written)
