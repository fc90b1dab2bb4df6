"""benchmarks/faults.py, short: one trial of each fault (kill -9, a damaged checkpoint, a full disk, SIGTERM)
against the real job; every rerun must finish with the uninterrupted run's params, losing nothing."""

import json
import subprocess
import sys

import train_setup


def test_every_fault_is_survived_bitwise_with_nothing_lost(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/faults.py", "--trials=4", "--steps=15",
                           f"--workdir={tmp_path}"], cwd=train_setup.ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["by_fault"]) == {"kill", "damage", "disk_full", "sigterm"}, result
    assert (result["trials"], result["survived"], result["bitwise_identical"]) == (4, 4, 4), result
    assert result["steps_lost"] == 0 and result["items_lost"] == 0, result
    full = result["by_fault"]["disk_full"]["runs"][0]
    assert full["first_exit"] == 1 and full["said"].startswith("bertjax: no space left on device for "), full
    assert result["by_fault"]["kill"]["runs"][0]["first_exit"] == -9
