"""Exact search at scale: `bertjax.finetuning.exact_search` over N random unit embeddings against Q queries, top
100, as `python -m bertjax.retrieval` runs it (batches gathered into blocks sized by `exact_search.block_rows`).

    python benchmarks/exact_search_scale.py [--documents=1000000] [--queries=1000] [--dim=384] [--batch=1024]

The documents are made on the device before the clock starts (a million × 384 float32 is 1.46 GiB), then fed a
batch at a time, as an encoder's batches arrive. Prints one JSON line: documents/s of the search; the host's resident
memory before and its peak during the search (the peak is reset when the search starts, Linux's clear_refs 5); the
device memory the search holds (queries, the running top-k, one block and the merge's temporaries, from the compiled
merge's memory analysis; and the device's own peak where it reports one, as GPUs do); and whether the first queries'
top 100 equal numpy's brute force over every document.
"""

import argparse
import json
import os
import time

import numpy as np

K = 100  # what recall@100 needs


def rss_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--documents", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=1024, help="documents a batch (an encoder's output)")
    p.add_argument("--check_queries", type=int, default=5, help="queries checked against numpy")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from bertjax.finetuning import exact_search

    @jax.jit
    def unit(key, rows):
        x = jax.random.normal(key, (rows.shape[0], args.dim), jnp.float32)
        return x / jnp.linalg.norm(x, axis=1, keepdims=True)

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    queries = unit(keys[0], jnp.zeros(args.queries))
    starts = range(0, args.documents, args.batch)
    batches = [unit(jax.random.fold_in(keys[1], i), jnp.zeros(min(args.batch, args.documents - i))) for i in starts]
    jax.block_until_ready(batches)
    block = exact_search.block_rows(args.queries, args.batch)
    rss_before = rss_bytes("VmRSS")
    peak_reset = reset_peak_rss()

    start = time.monotonic()
    top = exact_search.TopK(queries, K, block)
    for i, embeddings in zip(starts, batches):
        top.add(np.arange(i, i + embeddings.shape[0]), embeddings)
    scores, ids = top.result()
    seconds = time.monotonic() - start
    peak = rss_bytes("VmHWM")

    # What the search holds on the device: its arguments, outputs and temporaries, as XLA compiled the merge.
    merge = exact_search._merge.lower(
        top.best, top.best_ids, top.queries, jnp.zeros((block, args.dim)), jnp.zeros(block, jnp.int32), k=K
    ).compile()
    memory = merge.memory_analysis()
    device_search_bytes = sum(
        getattr(memory, name, 0) or 0
        for name in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    ) - (getattr(memory, "alias_size_in_bytes", 0) or 0)
    stats = jax.devices()[0].memory_stats() or {}

    # The first queries' top 100 from numpy, over every document.
    host_queries = np.asarray(queries[: args.check_queries])
    exact = np.concatenate([host_queries @ np.asarray(b).T for b in batches], axis=1)
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :K]
    agrees = bool(np.array_equal(np.sort(expected, axis=1), np.sort(ids[: args.check_queries], axis=1)))
    print(
        json.dumps(
            {
                "documents": args.documents,
                "queries": args.queries,
                "dim": args.dim,
                "k": K,
                "batch": args.batch,
                "block_rows": block,
                "blocks": top.blocks,
                "seconds": round(seconds, 3),
                "documents_per_s": round(args.documents / seconds),
                "embeddings_bytes": args.documents * args.dim * 4,
                "host_rss_before_search_bytes": rss_before,
                "host_peak_rss_during_search_bytes": peak if peak_reset else None,
                "host_peak_rss_process_bytes": peak if not peak_reset else max(peak, rss_before),
                "device_search_bytes": int(device_search_bytes),
                "device_merge_temp_bytes": int(getattr(memory, "temp_size_in_bytes", 0) or 0),
                "device_peak_bytes": stats.get("peak_bytes_in_use"),
                "device": str(jax.devices()[0].platform),
                "cores": os.cpu_count(),
                "top100_agrees_with_numpy": agrees,
                "checked_queries": args.check_queries,
                "scores_finite": bool(np.isfinite(scores).all()),
            }
        )
    )


if __name__ == "__main__":
    main()
