"""What the step benchmarks (train_step.py, finetune_step.py) share: interleaved timing of several runners."""

import statistics
import time


def time_interleaved(runners: dict, steps: int, warmup: int) -> dict:
    """Warm each up, then alternate one step of each, so load from elsewhere hits both alike."""
    times = {k: [] for k in runners}
    losses = {k: [] for k in runners}
    for i in range(warmup + steps):
        for name, run in runners.items():
            t = time.perf_counter()
            losses[name].append(run())
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return {
        k: dict(
            step_s=statistics.median(times[k]),
            min_s=min(times[k]),
            max_s=max(times[k]),
            times_s=times[k],
            loss=[losses[k][0], losses[k][-1]],
        )
        for k in runners
    }
