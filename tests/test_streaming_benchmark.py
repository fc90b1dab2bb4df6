"""benchmarks/streaming.py at a tiny scale: two hosts, each in its own process with its own cache and counting
proxy, hold at most their share and window on disk and fetch their share (plus at most two shards), counted by
the proxy; the figures that are timings are the benchmark's, not asserted here."""

import json
import subprocess
import sys

import train_setup


def test_two_hosts_hold_and_fetch_only_their_share(tmp_path):
    out = tmp_path / "streaming.json"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/streaming.py",
            "--set_gb=0.01",
            "--shards=8",
            "--hosts=2",
            "--parts=disk",
            f"--out={out}",
        ],
        cwd=train_setup.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result
    (row,) = result["disk"]
    share = result["set"]["bytes"] / 2
    assert row["hosts"] == 2 and row["peak_disk_met"] and row["fetched_met"], row
    for fetched, peak in zip(row["fetched_bytes_per_host"], row["peak_disk_bytes_per_host"]):
        assert share <= fetched <= share + 2 * result["set"]["shard_bytes"]  # its four shards, as the proxy served
        assert 0 < peak <= share + row["window_bytes"]
    assert sum(row["records_per_host"]) == 2 * row["records_per_host"][0] > 0  # the same shard bytes everywhere
