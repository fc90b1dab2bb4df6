"""benchmarks/gpu_compile.py and hlo_traffic.py: gpu_profile's variants compiled for an H200 that is not here
(the test extra's CUDA plugin, without CUDA libraries), and the bytes a compiled program's kernels move."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import hlo_traffic  # noqa: E402


def test_the_traffic_of_a_program_is_what_its_kernels_read_and_write():
    n = 512

    def step(x, w):
        h = jnp.tanh(x @ w)  # a dot, then an elementwise kernel reading and writing [n, n] f32

        def body(_, h):
            return jnp.sin(h) * 2.0

        return jax.lax.fori_loop(0, 3, body, h).sum(axis=0)  # 3 iterations of one kernel, then a reduction

    x = jnp.ones((n, n), jnp.float32)
    text = jax.jit(step).lower(x, x).compile().as_text()
    kernels = hlo_traffic.kernels(text)
    array = n * n * 4
    # Every kernel reads at least one [n, n] array; the loop's body runs three times.
    assert sum(k["runs"] for k in kernels) >= 4
    looped = [k for k in kernels if k["runs"] == 3]
    assert any(k["read"] == k["written"] == 3 * array for k in looped)  # sin(h)·2: h in, h out, three times
    traffic = hlo_traffic.traffic(text, bandwidth=1e12)
    assert traffic["bytes"] == sum(k["read"] + k["written"] for k in kernels) >= 9 * array
    assert traffic["categories"]["matmul"]["read_bytes"] == 2 * array  # x and w
    assert traffic["memory_bound_ms_at_bandwidth"] == round(traffic["memory_bound_bytes"] / 1e12 * 1e3, 3)
    assert hlo_traffic.array_bytes("(bf16[8,4]{1,0}, s8[1024]{0})", skip_workspace=True) == 64
    assert hlo_traffic.array_bytes("(bf16[8,4]{1,0}, s8[1024]{0})") == 64 + 1024


# A scanned stack's kernels as XLA:GPU fuses them: one reads a layer of the f32 stack (cast, then sliced),
# the other casts the whole stack.
SLICED_HLO = """HloModule stacked

%fused_layer (param_0: f32[24,8,4], param_1: bf16[8,4]) -> bf16[8,4] {
  %param_0 = f32[24,8,4]{2,1,0} parameter(0)
  %convert.1 = bf16[24,8,4]{2,1,0} convert(%param_0)
  %slice.1 = bf16[1,8,4]{2,1,0} slice(%convert.1), slice={[3:4], [0:8], [0:4]}
  %bitcast.1 = bf16[8,4]{1,0} bitcast(%slice.1)
  %param_1 = bf16[8,4]{1,0} parameter(1)
  ROOT %multiply.1 = bf16[8,4]{1,0} multiply(%bitcast.1, %param_1)
}

%fused_whole (param_0.2: f32[24,8,4]) -> bf16[24,8,4] {
  %param_0.2 = f32[24,8,4]{2,1,0} parameter(0)
  ROOT %convert.2 = bf16[24,8,4]{2,1,0} convert(%param_0.2)
}

ENTRY %main (p0: f32[24,8,4], p1: bf16[8,4]) -> (bf16[8,4], bf16[24,8,4]) {
  %p0 = f32[24,8,4]{2,1,0} parameter(0)
  %p1 = bf16[8,4]{1,0} parameter(1)
  %layer = bf16[8,4]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%fused_layer
  %whole = bf16[24,8,4]{2,1,0} fusion(%p0), kind=kLoop, calls=%fused_whole
  ROOT %t = (bf16[8,4]{1,0}, bf16[24,8,4]{2,1,0}) tuple(%layer, %whole)
}
"""


def test_a_kernel_that_slices_a_layer_out_of_a_stack_reads_that_layer():
    kernels = {k["name"]: k for k in hlo_traffic.kernels(SLICED_HLO)}
    assert set(kernels) == {"layer", "whole"}
    assert kernels["layer"]["read"] == 8 * 4 * 4 + 8 * 4 * 2  # one f32 layer of 24, and the bf16 operand
    assert kernels["whole"]["read"] == 24 * 8 * 4 * 4 and kernels["whole"]["written"] == 24 * 8 * 4 * 2


def test_each_branch_of_a_conditional_is_counted():
    n = 256
    step = jax.jit(lambda p, x: jax.lax.cond(p, lambda x: jnp.sin(x) * 2.0, lambda x: jnp.cos(x) * 3.0, x))
    kernels = hlo_traffic.kernels(step.lower(True, jnp.ones((n, n))).compile().as_text())
    # Both branches' kernels (one of them runs: an upper bound), each reading and writing the [n, n] array.
    assert sum(k["read"] == k["written"] == n * n * 4 for k in kernels) == 2


def _gpu_compile(out, *flags) -> subprocess.CompletedProcess:
    """benchmarks/gpu_compile.py on BERT-tiny (128 × 16), its rows into `out`."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_compile.py"), f"--out={out}", "--case=bert:tiny:128:16"]
        + list(flags),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_variants_compiled_for_an_h200_show_what_each_removes(tmp_path):
    done = _gpu_compile(tmp_path, "--gpu=h200", "--variants=baseline,recompute_activation,torch", "--keep_hlo")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["variant"]: r for r in map(json.loads, (tmp_path / "variants.jsonl").read_text().splitlines())}
    base, recomputed = rows["baseline"], rows["recompute_activation"]
    assert base["gpu"] == "h200" and base["attention"] == "xla" and base["kernels"] > 100
    # layers.exact_gelu keeps only its input for the backward, so recomputing it from the matmul's output keeps
    # as much (the matmul's output and the bias instead): no more traffic, no more memory.
    assert recomputed["memory_bound_gb"] <= base["memory_bound_gb"] and recomputed["temp_gib"] <= base["temp_gib"]
    assert recomputed["flags"] == ["--override", "model.recompute_activation=true"]
    assert rows["torch"]["skipped"].startswith("PyTorch's step")
    assert (tmp_path / "hlo_baseline.txt.gz").exists()
    assert "| recompute_activation |" in done.stdout and "compiled for h200" in done.stdout


def test_variants_that_do_not_compile_are_rows_saying_why(tmp_path):
    done = _gpu_compile(tmp_path, "--variants=latency_hiding,baseline", "--xla_flags=--xla_gpu_no_such_flag=true")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "variants.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["latency_hiding", "baseline"]
    assert all("xla_gpu_no_such_flag" in r["error"] for r in rows)
