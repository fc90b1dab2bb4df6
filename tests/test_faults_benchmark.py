"""benchmarks/faults.py, short: its harness on one fault of the job (a full disk), whose rerun must finish with the
uninterrupted run's params, losing nothing; one of each of prepare's (kill -9, a full disk), after which training is
refused or complete, never partial, no worker is left, and the same prepare command writes the reference's bytes;
a SIGTERM while glue compiles, which must exit 0 (no crash) before the same command trains to the end; and the
bucket's hardest case, small: an outage longer than the clients retry (45 s, the jobs' retry budget 10 s), which
must end the run in one sentence with no traceback and resume from the named step.

The job's other faults each have their own test, so the benchmark's full count stays in the benchmark: kill -9 and
SIGTERM (tests/test_resume_and_hosts.py), a damaged newest step, a full disk and a moved workdir, and a SIGTERM
while fine-tuning compiles (tests/test_faults.py), a damaged final step in a bucket (tests/test_bucket.py)."""

import json
import re
import subprocess
import sys

import train_setup


def test_every_fault_is_survived_bitwise_with_nothing_lost(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/faults.py",
            "--trials=1",
            "--faults=disk_full",
            "--steps=15",
            "--prepare_trials=2",
            "--compile_stop_trials=1",
            "--compile_faults=glue_compile",
            "--bucket_trials=0",  # ~1.5 min each (the clients' backoffs): tests/test_bucket_faults.py has one
            "--bucket_outage_trials=1",
            "--bucket_outage_s=45",  # past gcsfs's own retries (~31-36 s)
            "--bucket_retry_s=10",  # tensorstore's retries: ~15 s, not 15 minutes
            "--bucket_damage_trials=0",  # a damaged final step in a bucket: tests/test_bucket.py runs that case
            f"--workdir={tmp_path}",
        ],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["by_fault"]) == {"disk_full"}, result
    assert (result["trials"], result["survived"], result["bitwise_identical"]) == (1, 1, 1), result
    assert result["steps_lost"] == 0 and result["items_lost"] == 0, result
    full = result["by_fault"]["disk_full"]["runs"][0]
    assert full["first_exit"] == 1 and full["said"].startswith("bertjax: no space left on device for "), full
    prepare = result["prepare"]
    assert [r["fault"] for r in prepare["runs"]] == ["prepare_kill", "prepare_disk_full"], prepare
    assert prepare["partial"] == 0 and prepare["workers_left"] == 0 and prepare["rerun_identical"] == 2, prepare
    assert prepare["runs"][0]["workers_seen"] > 0, prepare  # the kill found workers to outlive it
    assert prepare["runs"][1]["exit"] == 1 and "no space left on the device writing" in prepare["runs"][1]["said"][0]
    stops = result["compile_stops"]
    assert [r["fault"] for r in stops["runs"]] == ["glue_compile"], stops
    assert (stops["clean_exits"], stops["crashes"], stops["reruns_finished"]) == (1, 0, 1), stops
    assert all(r["stopped_before_training"] for r in stops["runs"]), stops
    outage = result["bucket_outage"]
    assert (outage["trials"], outage["survived"], outage["bitwise_identical"]) == (1, 1, 1), outage
    assert (outage["one_sentence"], outage["tracebacks"], outage["steps_lost"], outage["items_lost"]) == (1, 0, 0, 0)
    run = outage["runs"][0]
    assert run["first_exit"] == 1 and run["named_step"] == run["resumed_from"] >= 5, run
    assert run["said"].startswith("bertjax: the bucket gs://") and "same command" in run["said"], run
    assert re.search(r"\d+ request\(s\) retried", run["said"]), run  # the clients' retries as counts
    assert result["bucket_damaged_final_step"]["trials"] == 0
