"""benchmarks/gpu_profile.py and profile_summary.py, without a GPU: the dry run takes every code path a
variant takes on the device (a config override, an XLA flag, the trace and its reduction), and the
reduction reads a GPU's kernel names (inside CUDA graphs too) as the device's trace writes them."""

import gzip
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_profile  # noqa: E402
import profile_summary  # noqa: E402

# The shapes of lines in XLA:GPU's optimized HLO: a fusion and its body, a cuBLAS call with a tuple shape,
# cuDNN attention, a scatter from the embedding gradient, the optimizer's update under its named scope.
HLO = """
%fused_dot (p0: bf16[8,16], p1: bf16[16,4]) -> bf16[8,4] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,4]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_scatter (p0: f32[2,4], p1: s32[8,1], p2: f32[8,4]) -> f32[2,4] {
  %p0 = f32[2,4]{1,0} parameter(0)
  ROOT %scatter.3 = f32[2,4]{1,0} scatter(%p0, %p1, %p2), to_apply=%add
}

%fused_hash (p0: u32[8]) -> u32[8] {
  %p0 = u32[8]{0} parameter(0)
  %shift-right-logical.1 = u32[8]{0} shift-right-logical(%p0, %p0)
  ROOT %xor.1 = u32[8]{0} xor(%p0, %shift-right-logical.1)
}

ENTRY %main (a: bf16[8,16], b: bf16[16,4]) -> bf16[8,4] {
  %gemm_fusion_dot.7 = bf16[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(step)/jvp(Model)/dense/dot_general"}
  %custom-call.2 = (bf16[8,4]{1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/transpose(jvp(Model))/dense/dot_general"}
  %custom-call.5 = (bf16[8,4]{1,0}, u8[0]{0}) custom-call(%a, %b), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(step)/jvp(Model)/attention"}
  %input_scatter_fusion.1 = f32[2,4]{1,0} fusion(%x, %y, %z), kind=kInput, calls=%fused_scatter, metadata={op_name="jit(step)/transpose(jvp(Model))/token_type_embeddings/scatter-add"}
  %loop_xor_fusion = u32[8]{0} fusion(%u), kind=kLoop, calls=%fused_hash, metadata={op_name="jit(step)/jvp(Model)/dropout/xor"}
  %loop_add_fusion.4 = f32[4]{0} fusion(%p, %g), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/optimizer/add"}
  ROOT %copy.9 = bf16[8,4]{1,0} copy(%gemm_fusion_dot.7)
}
"""


def test_hlo_instructions_are_categorised_and_phased():
    instructions, bodies = profile_summary.parse_hlo(HLO)
    assert instructions["custom-call.2"]["shape"].startswith("(bf16[8,4]")  # a tuple shape, parentheses matched
    expected = {
        "gemm_fusion_dot.7": ("matmul", "forward"),
        "custom-call.2": ("matmul", "backward"),
        "custom-call.5": ("attention (cuDNN)", "forward"),
        "input_scatter_fusion.1": ("scatter (embedding and gather gradients)", "backward"),
        "loop_xor_fusion": ("dropout hash (integer)", "forward"),
        "loop_add_fusion.4": ("optimizer", "optimizer"),
        "copy.9": ("copy/transpose", "other"),
    }
    for name, (category, phase) in expected.items():
        assert profile_summary.category(instructions[name], bodies) == category, name
        assert profile_summary.phase(instructions[name]) == phase, name
    # Kernels that name no instruction are told by their own names (cuBLAS's nvjet, memcpys).
    assert profile_summary.category(None, bodies, "<nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT>") == "matmul"
    assert profile_summary.category(None, bodies, "<memcpy128>") == "copy/transpose"
    assert profile_summary.category(None, bodies, "<something_else>") == profile_summary.CATEGORIES[-1]


def test_kernels_inside_cuda_graphs_are_matched_by_their_own_names():
    """Under XLA's command buffers a kernel's hlo_op names the command buffer, not the fusion it ran."""
    instructions, _ = profile_summary.parse_hlo(HLO)
    by_kernel = {name.replace(".", "_"): name for name in instructions}
    resolve = lambda op, kernel: profile_summary.instruction_of(op, kernel, instructions, by_kernel)  # noqa: E731
    assert resolve("command_buffer_54", "input_scatter_fusion_1") == "input_scatter_fusion.1"
    assert resolve("gemm_fusion_dot.7", "whatever_kernel") == "gemm_fusion_dot.7"  # hlo_op wins when it names one
    assert resolve("command_buffer_54", "nvjet_sm90_tst") == "<nvjet_sm90_tst>"
    assert resolve("", "memcpy128") == "<memcpy128>"


def test_combined_takes_only_same_numerics_changes_that_beat_the_noise():
    rows = {
        "baseline": dict(step_s=1.0),
        "loop_layers": dict(step_s=0.8),  # wins
        "cublas_gemm": dict(step_s=0.99),  # within the noise
        "no_dropout": dict(step_s=0.5),  # faster, but another model: attribution only
        "no_command_buffers": dict(error="boom"),
    }
    flags, xla, winners = gpu_profile.combined_variant(rows, rows["baseline"])
    assert winners == ["loop_layers"] and flags == ["--override", "model.scan_layers=false"] and xla == ""
    rows["no_command_buffers"] = dict(step_s=0.9)
    flags, xla, winners = gpu_profile.combined_variant(rows, rows["baseline"])
    assert winners == ["loop_layers", "no_command_buffers"] and xla == "--xla_gpu_enable_command_buffer="
    assert (
        gpu_profile.combined_variant({"baseline": dict(step_s=1.0), "cublas_gemm": dict(step_s=1.0)}, dict(step_s=1.0))
        is None
    )


def _dry_run(out, *flags: str) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """gpu_profile.py --dry_run into `out`: the finished process and its rows by variant."""
    # Every variant compiles with the suite's flags (conftest): its own XLA_FLAGS replace the inherited ones.
    level = f"--xla_flags={os.environ['XLA_FLAGS']}"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_profile.py", f"--out={out}", "--dry_run", "--variant_s=100", level, *flags],
        cwd=ROOT,
        env=dict(os.environ, BERTJAX_NO_TCMALLOC="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, {r["variant"]: r for r in map(json.loads, (out / "variants.jsonl").read_text().splitlines())}


def test_dry_run_takes_each_kind_of_variant_through_the_trace_and_its_summary(tmp_path):
    out = tmp_path / "results"
    done, rows = _dry_run(out, "--variants=baseline,scan_unrolled,no_command_buffers,cudnn,loop_cudnn")
    assert set(rows) == {"baseline", "scan_unrolled", "no_command_buffers", "cudnn", "loop_cudnn"}
    for name in ("baseline", "scan_unrolled", "no_command_buffers"):
        row = rows[name]
        assert row["step_s"] > 0 and row["pipelined_step_s"] > 0 and row["init_s"] > 0, row
        assert all(0 < loss < 20 for loss in row["loss"]), row
    assert rows["cudnn"]["skipped"] == rows["loop_cudnn"]["skipped"] == "needs a GPU (dry run)"
    assert rows["no_command_buffers"]["xla_flags"] == "--xla_gpu_enable_command_buffer="
    # Two overrides reach the job (model.scan_layers=true, model.scan_unroll=0): on a CPU the baseline's program.
    assert rows["scan_unrolled"]["loss"] == pytest.approx(rows["baseline"]["loss"], rel=1e-6), rows
    log = (out / "workers.log").read_text()
    assert f"XLA_FLAGS='{os.environ['XLA_FLAGS']} --xla_gpu_enable_command_buffer='" in log  # --xla_flags first
    assert "--override model.scan_layers=true --override model.scan_unroll=0" in log
    profiles = {p["variant"]: p for p in map(json.loads, (out / "profiles.jsonl").read_text().splitlines())}
    baseline = profiles["baseline"]
    assert baseline["matched_hlo"] > 0.9, baseline  # the CPU's op events name the HLO they ran
    assert {"matmul", "optimizer"} <= set(baseline["categories"]), baseline["categories"]
    assert {"forward", "backward", "optimizer"} <= set(baseline["phases"]), baseline["phases"]
    assert abs(sum(c["share"] for c in baseline["categories"].values()) - 1) < 1e-3
    # Each category's kernels a step, and those under 10 µs with their time: every event is counted once.
    categories = baseline["categories"].values()
    assert all(c["kernels"] >= c["short_kernels"] >= 0 and 0 <= c["short_ms"] <= c["ms"] for c in categories)
    assert abs(sum(c["kernels"] for c in categories) * baseline["steps"] - baseline["events"]) <= len(categories)
    assert any(c["short_kernels"] > 0 for c in categories)  # a CPU's tiny ops (the scalars, the schedule)
    assert len(baseline["top_ops"]) == 30 and baseline["wall_ms_per_step"] > 0
    # The baseline's HLO and raw trace come back too, so the reduction can be redone off the device.
    with gzip.open(out / "hlo_baseline.txt.gz", "rt") as f:
        assert "HloModule" in f.read(200)
    assert (out / "trace_baseline.xplane.pb.gz").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["baseline_step_s"] == rows["baseline"]["step_s"]
    assert "| baseline |" in done.stdout and "| cudnn | needs a GPU (dry run) |" in done.stdout
    # A mistyped override or size is one sentence naming it, not a KeyError, and before the CPU's peak is measured.
    for mistake, said in (
        (["--sizes=tiny", "--override", "model.scan_layer=false"], "--override 'model.scan_layer=false': want KEY"),
        (["--sizes=huge"], "--sizes: 'huge' unknown; choose from tiny,"),
    ):
        bad = subprocess.run(
            [sys.executable, "benchmarks/train_step.py", "--frameworks=jax", *mistake],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=dict(os.environ, BERTJAX_NO_TCMALLOC="1", JAX_PLATFORMS="cpu"),
            timeout=120,
        )
        assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith(said), bad.stderr[-2000:]


def test_dry_run_of_a_modernbert_case_runs_its_windows_in_blocks_to_the_same_losses(tmp_path):
    """ModernBERT's variants on the CPU: the baseline's sliding layers in blocks (xla, the default at this length)
    train to the losses of one attention over the row (the same model), the cuDNN ones are listed as needing a
    GPU, and --base reaches every variant."""
    out = tmp_path / "results"
    _, rows = _dry_run(
        out,
        "--case=modernbert:base:512:2",  # 2 rows: a tiny step at 512 tokens takes 1.4 s on 8
        "--variants=baseline,window_whole,cudnn_window_blocks",
        "--base=--override=model.remat_policy=none",
    )
    assert rows["baseline"]["case"] == dict(family="modernbert", size="tiny", seq=512, batch=2)
    assert rows["window_whole"]["step_s"] > 0 and rows["window_whole"]["loss"][0] > 0
    for a, b in zip(rows["window_whole"]["loss"], rows["baseline"]["loss"]):
        assert abs(a - b) < 1e-4 * abs(b), (rows["window_whole"]["loss"], rows["baseline"]["loss"])
    assert rows["cudnn_window_blocks"]["skipped"] == "needs a GPU (dry run)"
    log = (out / "workers.log").read_text()
    command = next(line for line in log.splitlines() if "model.window_block=0" in line)
    assert command.index("--override=model.remat_policy=none") < command.index("model.window_block=0")


def test_every_variants_overrides_name_a_field_of_the_job_config():
    """What a variant's `--override KEY=VALUE`s set exists in the config (a misspelt one would cost a loan's row),
    checked for all of them without running any."""
    from bertjax.config.schema import JobConfig

    config = JobConfig().to_dict()
    checked = 0
    for name, (_, flags, _, _) in gpu_profile.VARIANTS.items():
        for flag, item in zip(flags, flags[1:]):
            if flag != "--override":
                continue
            *path, field = item.partition("=")[0].split(".")
            node = config
            for part in path:
                node = node.get(part, {})
            assert field in node, f"{name}: {item} names no field of the config"
            checked += 1
    assert checked >= 8


def test_the_prepared_loan_script_names_only_variants_and_flags_gpu_profile_takes(monkeypatch):
    """benchmarks/gpu_loan.sh, the command the next lent GPU runs first: each of its gpu_profile runs parses
    (gpu_profile's own argument parser), names a known family and known variants, and packs its own --out."""
    import shlex

    script = open(os.path.join(ROOT, "benchmarks", "gpu_loan.sh")).read().replace("\\\n", " ")
    runs = [shlex.split(line)[1:] for line in script.splitlines() if line.startswith("profile ")]
    assert len(runs) == 2, runs
    names = [run[0] for run in runs]
    assert len(set(names)) == len(names)  # one .tgz each
    for name, *flags in runs:
        monkeypatch.setattr(sys, "argv", ["gpu_profile.py", "--out=/nowhere", *flags])
        args = gpu_profile.parse_args()
        assert args.case.split(":")[0] in gpu_profile.ORDERS, args.case
        unknown = set(args.variants.split(",")) - set(gpu_profile.VARIANTS) - {"combined"}
        assert not unknown, (name, unknown)
    # Its `table` stage: gpu_table.py rows, each run parsing and naming sizes and lengths the family has batches for.
    import gpu_table

    tables = [shlex.split(line)[1:] for line in script.splitlines() if line.strip().startswith("table ")]
    assert len(tables) >= 2 and len({t[0] for t in tables}) == len(tables), tables
    for name, seconds, *flags in tables:
        monkeypatch.setattr(sys, "argv", ["gpu_table.py", *flags])
        args = gpu_table.parse_args()
        batches = {tuple(b.split(":")[:2]) for b in gpu_table.BATCHES[args.family].split(",")}
        cases = {(size, seq) for size in args.sizes.split(",") for seq in args.seqs.split(",")}
        assert float(seconds) > 0 and cases <= batches, (name, cases - batches)
    done = subprocess.run(["bash", "-n", os.path.join(ROOT, "benchmarks", "gpu_loan.sh")], capture_output=True)
    assert done.returncode == 0, done.stderr
