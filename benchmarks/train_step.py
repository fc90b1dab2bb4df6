"""Train-step speed, bertjax vs transformers.BertForPreTraining (PyTorch), side by side in one run.

    python benchmarks/train_step.py [--sizes=tiny,base] [--steps=N] [--frameworks=jax,jax_packed,torch]
        [--seq=128] [--dtype=auto] [--attention=auto] [--batch=0] [--torch_compile] [--family=bert]

`--family=modernbert` runs configs/modernbert.py:size=<size> (tiny, base, large) beside
`transformers.ModernBertForMaskedLM` instead, MLM only (no NSP term), vocab 50,368, on the same batch (unpacked
rows unless `jax_packed`); everything else below holds for it too, with the family's own FLOPs formula.

One full pre-training step, vocab 30,522, dropout 0.1 on (training mode): forward + backward + AdamW
update, loss = MLM cross-entropy (weighted by masked_lm_weights) over 20 slots at seq 128 (80 at
512) + NSP cross-entropy, the same synthetic batch for both frameworks (no TensorFlow, no data files):
instances of 1/4 to all of the sequence length, 15% of their tokens masked (as create_pretraining_data
rounds it), padded to the sequence length. `jax_packed` runs bertjax on packed rows instead (`--batch`
rows, `config.data.packing`, up to 3 instances a row, made by `bertjax.data.pretraining.packing.pack` from more
instances of the same kind): compare the frameworks' `real_tokens_per_s`, the tokens that are not padding.
On the CPU it runs fp32; on a GPU (or TPU) bf16 by default (`--dtype`): bertjax computes in bf16 with
float32 params, PyTorch under `torch.autocast(bfloat16)` with SDPA attention (`--torch_compile` wraps the
model in `torch.compile`). `--attention=cudnn|splash` picks bertjax's fused kernel; fused kernels have
no attention-probability dropout, so that option sets it to 0 for both frameworks.

- JAX: bertjax's own train step as the job runs it: configs/<size>.py's model (scan_layers as
  configured) and optimizer (AdamW with BERT's weight-decay mask, global-norm clipping, the schedule),
  built by `trainer.setup` (compiled ahead of time, donated state) on a one-device mesh. The model
  gathers the 20 masked positions before the MLM head.
- PyTorch: `BertForPreTraining` in train mode, default attention implementation, `torch.optim.AdamW`
  (its default single-tensor implementation on CPU), MLM logits on all positions with labels=-100
  elsewhere, which is how users run it. torch gets every core (`torch.set_num_threads(os.cpu_count())`).

Model FLOPs are the job's own count, `bertjax.training.metrics.flops_per_sequence`: 3 × the forward matmul
FLOPs (per layer and token 4 H×H projections, 2 H×4H FFN matmuls, attention scores and context 2·2·S·H;
pooler and NSP per sequence; MLM transform H×H and vocab projection H×V on the 20 gathered positions
only). MFU is measured against
a float32 matmul peak the script measures itself, in the same process: a jitted `jnp.dot` of square
fp32 matrices, best of several sizes, 2n³ FLOPs; on a GPU or TPU against the chip's dense peak for the
dtype (`bertjax.training.metrics.PEAK_FLOPS`: H100 SXM and H200 989 TFLOP/s bf16). Each timing is the median of --steps steps after a
warm-up. Both frameworks run in one process, under tcmalloc when the machine has it (see
bertjax/runtime/tcmalloc.py; the JSON says which allocator). Prints one JSON line per size.
"""

import argparse
import json
import os
import platform
import time

VOCAB = 30522
PREDICTIONS = {128: 20, 512: 80, 1024: 160}  # 15% (as create_pretraining_data rounds); 1024: ModernBERT only
BATCH = {"tiny": 32, "mini": 32, "small": 16, "medium": 16, "base": 8, "large": 4}  # CPU defaults
STEPS = {"tiny": 20, "base": 5}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="tiny,base")
    p.add_argument("--steps", type=int, default=0, help="timed steps per framework; 0 = a default per size")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--frameworks", default="jax,torch", help="of jax, jax_packed (packed rows), torch")
    p.add_argument(
        "--scan_layers", type=int, default=-1, help="override config.model.scan_layers (0/1); -1 = as the config says"
    )
    # None of XLA:CPU's dot-library, fusion or scheduler flags made this step faster (issue 4's note).
    p.add_argument("--xla_flags", default="", help="XLA flags to try; the user's own XLA_FLAGS come after, and win")
    p.add_argument("--no_peak", action="store_true", help="skip the matmul peak (MFU is then null)")
    p.add_argument("--seq", type=int, default=128, choices=sorted(PREDICTIONS))
    p.add_argument("--batch", type=int, default=0, help="sequences per step; 0 = a CPU default per size")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="compute dtype; auto = float32 on CPU, bfloat16 on accelerators",
    )
    p.add_argument("--attention", default="auto", choices=("auto", "xla", "splash", "cudnn"))
    p.add_argument("--torch_compile", action="store_true", help="wrap the PyTorch model in torch.compile")
    p.add_argument("--family", default="bert", choices=("bert", "modernbert"))
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config field for bertjax's step, e.g. model.scan_layers=false (repeatable; last wins)",
    )
    p.add_argument(
        "--profile_dir",
        default="",
        help="after timing, trace --profile_steps of the first bertjax step here and reduce it to "
        "profile.json (profile_summary.py), beside hlo.txt.gz, the program's optimized HLO",
    )
    p.add_argument("--profile_steps", type=int, default=3)
    p.add_argument(
        "--compile_for",
        default="",
        metavar="GPU",
        help="compile bertjax's step for one GPU that need not be here (a100, h100, h200: bertjax.training."
        "gpu_targets) instead of running it; print what its kernels move (hlo_traffic.py), the HLO to --profile_dir",
    )
    return p.parse_args()


ARGS = parse_args()
SEQ, PRED = ARGS.seq, PREDICTIONS[ARGS.seq]
MODERN = ARGS.family == "modernbert"
if SEQ > 512 and not MODERN:
    raise SystemExit(f"--seq={SEQ}: BERT has 512 positions; sequences of 1,024 are for --family=modernbert.")
if MODERN:
    VOCAB = 50368
from bertjax.runtime import tcmalloc  # noqa: E402
from timing import time_interleaved  # noqa: E402  (benchmarks/timing.py, beside this script)

tcmalloc.reexec_under_tcmalloc()  # as `python -m bertjax.main` runs; BERTJAX_NO_TCMALLOC=1 keeps glibc's
os.environ["XLA_FLAGS"] = (ARGS.xla_flags + " " + os.environ.get("XLA_FLAGS", "")).strip()
from bertjax.runtime import xla_flags  # noqa: E402

# The flags every bertjax command adds on NVIDIA GPUs (cli.quiet), so the step timed is the one a job runs; the
# flags above win, as a user's own do.
xla_flags.apply_gpu_defaults(for_gpu=bool(ARGS.compile_for))

if ARGS.compile_for:  # for a GPU that is not here: this machine's devices stay its own, the CUDA plugin quiet
    from bertjax.training import aot  # noqa: E402
    from bertjax.runtime import gpu_targets

    gpu_targets.quiet_cuda_plugin(tpu_here=not aot.no_tpu_here())
import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from ml_collections import ConfigDict  # noqa: E402

from bertjax.training import metrics as metrics_lib  # noqa: E402
from bertjax.config.schema import JobConfig  # noqa: E402


# --- Batch ------------------------------------------------------------------------------------------


def make_batch(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Instances of length S/4..S padded to S, two segments, round(15%) distinct masked positions each
    (at most PRED; the unused slots weigh 0)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(SEQ // 4, SEQ + 1, batch)
    pos = np.arange(SEQ)[None, :]
    input_mask = (pos < lengths[:, None]).astype(np.int32)
    input_ids = (rng.integers(1000, VOCAB, (batch, SEQ)) * input_mask).astype(np.int32)
    input_ids[:, 0] = 101
    segment_ids = ((pos >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    positions = np.zeros((batch, PRED), np.int32)
    weights = np.zeros((batch, PRED), np.float32)
    for i, n in enumerate(lengths):
        k = min(PRED, max(1, round(0.15 * n)))
        positions[i, :k] = np.sort(rng.choice(np.arange(1, n - 1), k, replace=False))
        weights[i, :k] = 1.0
    labels = np.take_along_axis(input_ids, positions, axis=1) * (weights > 0)
    np.put_along_axis(input_ids, positions, 103, axis=1)
    input_ids[:, 0] = 101  # unused prediction slots point at position 0: keep [CLS] there
    return dict(
        input_ids=input_ids,
        segment_ids=segment_ids,
        input_mask=input_mask,
        masked_lm_positions=positions,
        masked_lm_ids=labels.astype(np.int32),
        masked_lm_weights=weights,
        next_sentence_labels=rng.integers(0, 2, (batch, 1)).astype(np.int32),
        example_weight=np.ones((batch,), np.float32),
    )


def make_packed_batch(rows: int, predictions_per_row: int, max_instances_per_row: int) -> dict[str, np.ndarray]:
    """`rows` packed rows of make_batch's instances (the first rows of a larger pack, which are full)."""
    from bertjax.data.pretraining import packing

    cfg = packing.PackingConfig(SEQ, max_instances_per_row, predictions_per_row)
    packed = packing.pack(make_batch(rows * (max_instances_per_row + 1), seed=1), cfg)
    packed = {k: v[:rows] for k, v in packed.items()}
    return dict(packed, example_weight=np.ones((rows,), np.float32))


def real_tokens(batch_np: dict) -> int:
    return int((batch_np["input_mask"] > 0).sum())


# --- FLOPs and peak ---------------------------------------------------------------------------------


def matmul_peak(sizes=(1024, 2048, 3072, 4096), reps: int = 3) -> dict:
    """Best fp32 FLOP/s of a jitted jnp.dot of square matrices."""
    best, best_n = 0.0, 0
    dot = jax.jit(jnp.dot)
    for n in sizes:
        a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
        dot(a, b).block_until_ready()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            dot(a, b).block_until_ready()
            times.append(time.perf_counter() - t)
        rate = 2.0 * n**3 / min(times)
        if rate > best:
            best, best_n = rate, n
    return dict(flops=best, n=best_n)


# --- JAX --------------------------------------------------------------------------------------------


def compute_dtype() -> str:
    if ARGS.dtype != "auto":
        return ARGS.dtype
    return "float32" if jax.default_backend() == "cpu" and not ARGS.compile_for else "bfloat16"


def jax_config(size: str, batch_size: int, packed: bool = False) -> ConfigDict:
    """configs/<size>.py as users get it, with this benchmark's batch, sequence length and predictions."""
    import runpy

    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    if MODERN:
        c = runpy.run_path(os.path.join(configs, "modernbert.py"))["get_config"](f"size={size}")
    else:
        c = runpy.run_path(os.path.join(configs, f"{size}.py"))["get_config"]()
    c.model.vocab_size = VOCAB
    c.data.max_seq_length, c.data.max_predictions_per_seq = SEQ, PRED
    c.train.global_batch_size = batch_size
    c.train.micro_batches = 1
    c.data.packing = packed
    c.mesh.shape = (1, 1, 1)
    c.model.dtype = compute_dtype()
    c.model.attention = ARGS.attention
    if ARGS.attention in ("splash", "cudnn"):
        c.model.attention_probs_dropout_prob = 0.0  # fused kernels have none (for PyTorch too: same model)
    if ARGS.scan_layers >= 0:
        c.model.scan_layers = bool(ARGS.scan_layers)
    for item in ARGS.override:
        apply_override(c, item)
    return c


def apply_override(c: ConfigDict, item: str) -> None:
    """`section.field=value` onto the config, the value read as the field's current type."""
    key, sep, raw = item.partition("=")
    *path, field = key.strip().split(".")
    node = c
    for name in path:
        node = node[name] if name in node else None
        if not isinstance(node, ConfigDict):
            raise SystemExit(f"--override {item!r}: no config section {'.'.join(path)!r}.")
    if not sep or field not in node:
        raise SystemExit(
            f"--override {item!r}: want KEY=VALUE with KEY a field of the config, e.g. model.scan_layers=false."
        )
    current = node[field]
    words = {"true": True, "yes": True, "false": False, "no": False, "none": None}
    if isinstance(current, bool) or (current is None and raw.strip().lower() in words):  # None: the platform's
        value = words.get(raw.strip().lower(), raw.strip() == "1")
    elif isinstance(current, (int, float)):
        value = type(current)(raw)
    else:
        value = raw
    node[field] = value


def jax_runner(size: str, batch_np: dict, packed: bool = False):
    """bertjax's own train step — `trainer.setup` on the configured model and optimizer, compiled ahead of
    time with donated state on a one-device mesh, as the job builds it — as a callable running one step."""
    from bertjax.training import trainer as trainer_lib

    job = JobConfig.from_configdict(jax_config(size, batch_np["input_ids"].shape[0], packed))
    t = time.perf_counter()
    trainer = trainer_lib.setup(job, jax.devices()[:1])
    info = dict(
        compile_s=time.perf_counter() - t,
        scan_layers=job.model.layer_scan(jax.default_backend()),
        remat_policy=job.model.remat_policy,
        optimizer=job.optim.name,
        max_grad_norm=job.optim.max_grad_norm,
    )
    batch = {
        k: jax.device_put(np.asarray(batch_np[k], v.dtype).reshape(v.shape), v.sharding)
        for k, v in trainer.batch_abstract.items()
    }
    t = time.perf_counter()
    holder = dict(state=jax.block_until_ready(trainer.init_state()))
    info["init_s"] = time.perf_counter() - t  # compiling and running the init (XLA:GPU's was ~200 s unrolled)

    def run() -> float:
        holder["state"], metrics = trainer.train_step(holder["state"], batch)
        return float(metrics["loss"][0])  # blocks until the step is done

    def pipelined(steps: int) -> float:
        """Seconds a step when steps are dispatched back to back and waited for once, as the job's loop runs."""
        start = time.perf_counter()
        for _ in range(steps):
            holder["state"], _ = trainer.train_step(holder["state"], batch)
        jax.block_until_ready(holder["state"])
        return (time.perf_counter() - start) / steps

    return run, dict(info, pipelined=pipelined, hlo=trainer.train_step.as_text)


def profile(name: str, run, pipelined, hlo, directory: str) -> dict:
    """A trace of --profile_steps steps of `run` reduced on the spot (profile_summary.py): what gpu_profile.py
    brings back from a GPU. Writes DIRECTORY/profile.json, hlo.txt.gz and the raw trace under trace/."""
    import gzip

    import profile_summary  # benchmarks/, beside this script

    os.makedirs(directory, exist_ok=True)
    with gzip.open(os.path.join(directory, "hlo.txt.gz"), "wt") as f:
        text = hlo()
        f.write(text)
    run()  # the device idle and the step warm before the trace starts
    jax.profiler.start_trace(os.path.join(directory, "trace"))
    wall = pipelined(ARGS.profile_steps) * ARGS.profile_steps
    jax.profiler.stop_trace()
    summary = dict(
        framework=name, **profile_summary.summarize(os.path.join(directory, "trace"), text, ARGS.profile_steps, wall)
    )
    with open(os.path.join(directory, "profile.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


# --- PyTorch ----------------------------------------------------------------------------------------


def torch_runner(cfg, batch_np: dict):
    """The transformers model and torch.optim.AdamW as a zero-argument callable running one step."""
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = compute_dtype() == "bfloat16"
    if MODERN:
        from bertjax.models.modernbert import config as modernbert_config

        config = transformers.ModernBertConfig(**modernbert_config.to_hf_dict(cfg), attn_implementation="sdpa")
        model = transformers.ModernBertForMaskedLM(config).to(device).train()
    else:
        config = transformers.BertConfig(**cfg.to_dict(), attn_implementation="sdpa")
        model = transformers.BertForPreTraining(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    forward = torch.compile(model) if ARGS.torch_compile else model
    labels = np.full(batch_np["input_ids"].shape, -100, np.int64)
    used = batch_np["masked_lm_weights"] > 0
    rows = np.nonzero(used)[0]
    labels[rows, batch_np["masked_lm_positions"][used]] = batch_np["masked_lm_ids"][used]
    inputs = (
        dict(input_ids=batch_np["input_ids"], attention_mask=batch_np["input_mask"], labels=labels)
        if MODERN
        else dict(
            input_ids=batch_np["input_ids"],
            token_type_ids=batch_np["segment_ids"],
            attention_mask=batch_np["input_mask"],
            labels=labels,
            next_sentence_label=batch_np["next_sentence_labels"][:, 0],
        )
    )
    kwargs = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in inputs.items()}

    def run() -> float:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(**kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # synchronises with the device

    return run, dict(
        attn_implementation=model.config._attn_implementation,
        device=device,
        autocast="bfloat16" if bf16 else None,
        compiled=ARGS.torch_compile,
    )


def compile_for_gpu(size: str, batch_size: int) -> dict:
    """The step compiled for ARGS.compile_for's GPU, here or not, as the job would build it there: the row."""
    import gzip

    import hlo_traffic
    from bertjax.training import aot
    from bertjax.runtime import gpu_targets
    from bertjax.training import trainer as trainer_lib

    gpu = gpu_targets.GPUS[ARGS.compile_for]
    _, _, devices = aot.topology_devices(f"{ARGS.compile_for}:1")
    job = JobConfig.from_configdict(jax_config(size, batch_size))
    start = time.perf_counter()
    trainer = trainer_lib.setup(job, devices, compile=False)
    compiled = trainer.compile_step(gpu_targets.COMPILER_OPTIONS)
    text = compiled.as_text()
    if ARGS.profile_dir:
        os.makedirs(ARGS.profile_dir, exist_ok=True)
        with gzip.open(os.path.join(ARGS.profile_dir, "hlo.txt.gz"), "wt") as f:
            f.write(text)
    memory = trainer_lib.memory_bytes(compiled) or {}
    return dict(
        compile_s=time.perf_counter() - start,
        temp_bytes=memory.get("temp"),
        attention=trainer.model.attention,
        traffic=hlo_traffic.traffic(text, gpu.memory_bandwidth),
    )


def main():
    for size in ARGS.sizes.split(","):  # a mistyped size or --override refused before the peak's seconds of matmuls
        if size not in BATCH:
            raise SystemExit(f"--sizes: {size!r} unknown; choose from {', '.join(BATCH)}.")
        try:
            jax_config(size, ARGS.batch or BATCH[size])
        except ValueError as e:  # configs/modernbert.py's sizes are fewer
            raise SystemExit(f"--sizes: {e}") from None
    if ARGS.compile_for:  # one JSON line per size: the compiled program, nothing run
        for size in ARGS.sizes.split(","):
            batch = ARGS.batch or BATCH[size]
            row = dict(family=ARGS.family, size=size, batch=batch, seq=SEQ, dtype=compute_dtype(), gpu=ARGS.compile_for)
            print(json.dumps(dict(row, **compile_for_gpu(size, batch), jax=jax.__version__)), flush=True)
        return
    frameworks = ARGS.frameworks.split(",")
    unknown = set(frameworks) - {"jax", "jax_packed", "torch"}
    if unknown:
        raise SystemExit(f"--frameworks: {sorted(unknown)} unknown; choose from jax, jax_packed, torch.")
    if "torch" in frameworks:
        import torch
        import transformers

        default_threads = (torch.get_num_threads(), torch.get_num_interop_threads())
        torch.set_num_threads(os.cpu_count())
    t0 = time.perf_counter()
    on_cpu = jax.default_backend() == "cpu"
    peak = None if ARGS.no_peak or not on_cpu else matmul_peak()
    for size in ARGS.sizes.split(","):
        batch_size = ARGS.batch or BATCH[size]
        cfg = JobConfig.from_configdict(jax_config(size, batch_size)).model.architecture
        steps = ARGS.steps or STEPS.get(size, 5)
        batches = dict(jax=make_batch(batch_size))
        batches["torch"] = batches["jax"]
        # The job's own MFU count, per row: a packed row has more prediction slots (and [CLS] rows).
        flops = dict(jax=metrics_lib.flops_per_sequence(cfg, SEQ, PRED) * batch_size)
        flops["torch"] = flops["jax"]
        if "jax_packed" in frameworks:
            data = JobConfig.from_configdict(jax_config(size, batch_size, packed=True)).data
            batches["jax_packed"] = make_packed_batch(batch_size, data.predictions_per_row, data.max_instances_per_row)
            flops["jax_packed"] = metrics_lib.flops_per_sequence(cfg, SEQ, data.predictions_per_row) * batch_size
        row = dict(
            family=ARGS.family,
            size=size,
            batch=batch_size,
            seq=SEQ,
            predictions=PRED,
            vocab=VOCAB,
            steps=steps,
            dtype=compute_dtype(),
            device=jax.devices()[0].device_kind,
            model_tflops_per_step=flops["jax"] / 1e12,
        )
        runners, infos = {}, {}
        for name in frameworks:
            if name == "torch":
                runners[name], infos[name] = torch_runner(cfg, batches[name])
            else:
                runners[name], infos[name] = jax_runner(size, batches[name], packed=name == "jax_packed")
        res = time_interleaved(runners, steps, ARGS.warmup)
        for name in res:  # bertjax's steps dispatched back to back too: what the host's syncs cost
            if name != "torch":
                res[name]["pipelined_s"] = infos[name]["pipelined"](steps)
        traced = next((n for n in frameworks if n != "torch"), None)
        if ARGS.profile_dir and traced:
            summary = profile(
                traced, runners[traced], infos[traced]["pipelined"], infos[traced]["hlo"], ARGS.profile_dir
            )
            row_profile = dict(
                busy_ms=summary["busy_ms_per_step"],
                idle_ms=summary.get("idle_ms_per_step"),
                top_category=next(iter(summary["categories"]), None),
            )
        for name in list(infos):
            infos[name].pop("pipelined", None)
            infos[name].pop("hlo", None)
        if peak:  # the best of before and after, so a busy moment cannot inflate MFU
            peak = max(peak, matmul_peak(), key=lambda p: p["flops"])
        elif not ARGS.no_peak:  # an accelerator: the chip's dense peak for the dtype
            chip_peak = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind, compute_dtype())
            peak = dict(flops=chip_peak, n=None) if chip_peak else None
        for name, r in res.items():
            b = batches[name]
            instances = int(b["next_sentence_weights"].sum()) if name == "jax_packed" else batch_size
            row.update(
                {
                    f"{name}_step_s": r["step_s"],
                    f"{name}_step_min_max_s": [r["min_s"], r["max_s"]],
                    f"{name}_seq_per_s": instances / r["step_s"],  # instances (sequences) a second
                    f"{name}_tokens_per_s": batch_size * SEQ / r["step_s"],
                    f"{name}_real_tokens_per_s": real_tokens(b) / r["step_s"],
                    f"{name}_loss": r["loss"],
                }
            )
            if name != "torch":
                row[f"{name}_compile_s"] = infos[name].pop("compile_s")
                row[f"{name}_pipelined_step_s"] = r["pipelined_s"]
            row.update({f"{name}_{k}": v for k, v in infos[name].items()})
            if peak:  # for PyTorch the same model-FLOPs count: its extra MLM logits are not useful work
                row[f"{name}_mfu"] = flops[name] / r["step_s"] / peak["flops"]
        if ARGS.profile_dir and traced:
            row[f"{traced}_profile"] = row_profile
        if "jax" in res:  # the names earlier versions printed
            row.update(achieved_tflops=flops["jax"] / res["jax"]["step_s"] / 1e12, mfu=row.get("jax_mfu"))
        if "jax" in res and "torch" in res:
            row["speedup"] = res["torch"]["step_s"] / res["jax"]["step_s"]
        if "jax" in res and "jax_packed" in res:  # what packing buys on this chip: real tokens a second
            row["packed_speedup"] = row["jax_packed_real_tokens_per_s"] / row["jax_real_tokens_per_s"]
        if peak:
            row.update(
                matmul_peak_tflops=peak["flops"] / 1e12,
                matmul_peak_n=peak["n"],
                peak_source="measured fp32 matmul" if on_cpu else "chip's dense peak (bertjax.training.metrics)",
            )
        if "torch" in frameworks:
            row.update(
                torch=torch.__version__,
                transformers=transformers.__version__,
                torch_threads=torch.get_num_threads(),
                torch_interop_threads=torch.get_num_interop_threads(),
                torch_default_threads=list(default_threads),
            )
        row.update(
            jax=jax.__version__,
            python=platform.python_version(),
            cpu_count=os.cpu_count(),
            loadavg_1m=os.getloadavg()[0],
            xla_flags=os.environ.get("XLA_FLAGS", ""),
            allocator="tcmalloc" if tcmalloc.active() else "system",
            elapsed_s=time.perf_counter() - t0,
        )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
