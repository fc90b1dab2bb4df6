"""benchmarks/tpu_fit.py's search, against a stand-in compiler (memory = state + activations / micro-batches):
it must find the fewest power-of-two micro-batches that fit (the fewest count that splits the batch where no
power of two does), with few compiles, and start a larger batch from what a smaller one needed. The real compiles are tests/test_aot.py's."""

import importlib.util
import os
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30


@pytest.fixture
def tpu_fit():
    spec = importlib.util.spec_from_file_location("tpu_fit", os.path.join(ROOT, "benchmarks", "tpu_fit.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in_compiler(tpu_fit, monkeypatch, state_gib: float, activations_gib_per_row: float, hbm_gib: float = 16):
    """Replaces the compile: per device, state + rows per micro-batch × activations, 8 devices."""
    compiled = []

    def attempt(args, done, model, seq, batch, slice_name, mesh, remat, micro):
        key = tpu_fit._key(model, seq, batch, slice_name, mesh, remat, micro)
        if key not in done:
            compiled.append((batch, micro))
            rows = batch / 8 / micro
            total = (state_gib + rows * activations_gib_per_row) * GIB
            report = dict(
                topology="v5e:2x4",
                num_devices=8,
                mesh={"data": 8, "fsdp": 1, "tensor": 1},
                remat_policy=remat,
                micro_batches=micro,
                total_bytes=total,
                temp_bytes=total - state_gib * GIB,
                argument_bytes=state_gib * GIB,
                code_bytes=0,
                hbm_bytes_per_device=hbm_gib * GIB,
                fits=total <= hbm_gib * GIB,
                flops_per_step=1.0,
            )
            done[key] = dict(
                key=key,
                model=model,
                seq=seq,
                global_batch_size=batch,
                slice=slice_name,
                mesh=mesh,
                remat=remat,
                micro_batches=micro,
                report=report,
                error=None,
            )
        return done[key]

    monkeypatch.setattr(tpu_fit, "attempt", attempt)
    return compiled


def fewest_that_fit(batch, state_gib, per_row, hbm_gib=16):
    micro = 1
    while state_gib + batch / 8 / micro * per_row > hbm_gib:
        micro *= 2
    return micro


@pytest.mark.parametrize("state_gib,per_row", [(4.0, 0.01), (6.0, 0.05), (1.0, 0.002), (10.0, 0.2)])
def test_search_finds_the_fewest_micro_batches(tpu_fit, monkeypatch, state_gib, per_row):
    compiled = stand_in_compiler(tpu_fit, monkeypatch, state_gib, per_row)
    args = types.SimpleNamespace()
    done = {}
    small = tpu_fit.search(args, done, "large", 128, 4096, "v5e-16")
    assert small["fits"] and small["micro_batches"] == fewest_that_fit(4096, state_gib, per_row)
    assert len(compiled) <= 4, compiled

    compiled.clear()
    large = tpu_fit.search(args, done, "large", 128, 65536, "v5e-16")
    assert large["fits"] and large["micro_batches"] == fewest_that_fit(65536, state_gib, per_row)
    # Started from 16 × the smaller batch's count, not from 1; and the smaller batch's failures rule out
    # compiling their scaled counts again.
    assert compiled[0] == (65536, 16 * small["micro_batches"]), compiled
    assert len(compiled) <= 4, compiled  # halving from 16 down to 1 would be 5


def test_search_finds_the_fewest_count_that_splits_when_no_power_of_two_fits_and_splits(tpu_fit, monkeypatch):
    # 576 rows on 8 devices split into 1, 2, 3, 4, 6, 8, 9, 12, 18 ... micro-batches, never 16; with 4 GiB of
    # state and 1.5 GiB a row, 72 rows a device fit 16 GiB in 9 micro-batches (8 rows each), not in 8.
    compiled = stand_in_compiler(tpu_fit, monkeypatch, state_gib=4.0, activations_gib_per_row=1.5)
    row = tpu_fit.search(types.SimpleNamespace(), {}, "large", 8192, 576, "v5e-16")
    assert row["fits"] and row["micro_batches"] == 9, (row, compiled)
    assert all(576 % (8 * micro) == 0 for _, micro in compiled), compiled
    assert (576, 8) in compiled and len(compiled) <= 5, compiled  # 8 was tried and did not fit


def test_search_says_when_nothing_fits(tpu_fit, monkeypatch):
    stand_in_compiler(tpu_fit, monkeypatch, state_gib=20.0, activations_gib_per_row=0.01)
    row = tpu_fit.search(types.SimpleNamespace(), {}, "large", 128, 4096, "v5e-16")
    assert row["fits"] is False


def test_next_probe_predicts_from_two_compiles(tpu_fit):
    # 2 + 64 / micro GiB against 16: 8 micro-batches (10 GiB) fit, 4 (18 GiB) do not.
    reports = [dict(micro_batches=m, total_bytes=(2 + 64 / m) * GIB, hbm_bytes_per_device=16 * GIB) for m in (64, 32)]
    assert tpu_fit.next_probe(reports, too_few=0, fits=32) == 8  # not 16: the halving skipped
    assert tpu_fit.next_probe(reports[:1], too_few=0, fits=64) == 32  # one compile: halve
    assert tpu_fit.next_probe(reports, too_few=16, fits=32) == 32 // 2  # never at or below a known failure
