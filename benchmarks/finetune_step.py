"""Fine-tuning step speed, bertjax vs transformers.BertForSequenceClassification (PyTorch), in one run.

    python benchmarks/finetune_step.py [--model=base] [--seq_len=128] [--batch_size=32] [--steps=5]
        [--warmup=2] [--num_labels=2] [--frameworks=jax,torch] [--scan_layers=-1] [--torch_fused]

One full sequence-classification fine-tuning step (GLUE's setting: BERT-Base, vocab 30,522, seq 128,
batch 32, 2 labels, dropout 0.1 on): forward + backward + optimizer update, the same synthetic batch for
both frameworks (rows of S/2..S real tokens with padding, two segments, random labels; no data files).
fp32 on the CPU; bf16 elsewhere (`--dtype`), PyTorch then under `torch.autocast(bfloat16)`.

- JAX: bertjax's own fine-tuning step as `python -m bertjax.finetune` builds it: configs/finetune.py
  (`size=--model`) with `heads.task(heads.from_config(...), task, regression=False, seq_len)` handed to
  `trainer.setup` (compiled ahead of time, donated state) on a one-device mesh; its optimizer is the
  job's: BERT's AdamW (weight-decay mask), global-norm clipping at 1.0, linear warmup + decay, and the
  non-finite guard. Its head reads only [CLS], so the last layer computes only that row (BertModel's
  `pooled_only`: same loss and gradients, ~7% fewer FLOPs for BERT-Base); transformers computes it all.
- PyTorch: `BertForSequenceClassification` in train mode (SDPA attention), as a transformers fine-tune
  runs it: `torch.optim.AdamW` (weight decay 0.01 except biases and LayerNorm; its default
  implementation on CPU, `--torch_fused` for fused=True), `get_linear_schedule_with_warmup`,
  `clip_grad_norm_(1.0)`. torch gets every core (`torch.set_num_threads(os.cpu_count())`) unless
  `--torch_threads` says otherwise: on a CPU shared with other busy processes, torch's OpenMP barriers
  wait for descheduled threads (MiniLM's step on 2 loaded cores: 8.1 s with 2 threads, 0.72 s with 1),
  so compare at both and read `loadavg_1m`.

Each timing is the median of --steps steps after --warmup warm-up steps, the two frameworks'
steps interleaved so load from elsewhere hits both alike. Both run in one process, under tcmalloc
when the machine has it (bertjax/runtime/tcmalloc.py; the JSON says which allocator). Model FLOPs are the job's
own count (`task.flops_per_row`, `bertjax.training.metrics.flops_per_sequence` with no MLM predictions). Prints
one JSON line.
"""

import argparse
import json
import os
import platform
import time

VOCAB = 30522


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="base", help="tiny, mini, small, medium, base or large")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="timed steps per framework (median reported)")
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps per framework first; two, because the second step still faults in GBs of "
        "fresh buffers (1.4M page faults, +13 s on a 2-core VM) before the allocator holds them",
    )
    p.add_argument("--num_labels", type=int, default=2)
    p.add_argument("--frameworks", default="jax,torch")
    p.add_argument(
        "--scan_layers",
        type=int,
        default=-1,
        help="override config.model.scan_layers (0/1); -1 = as configs/finetune.py says",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="compute dtype; auto = float32 on CPU, bfloat16 on accelerators",
    )
    p.add_argument("--torch_fused", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument(
        "--torch_threads",
        type=int,
        default=0,
        help="torch.set_num_threads; 0 = every core (os.cpu_count()). On a box loaded by other "
        "processes, 1 can be far faster: torch's OpenMP barriers wait for descheduled threads",
    )
    p.add_argument("--xla_flags", default="", help="XLA flags to try; the user's own XLA_FLAGS come after, and win")
    return p.parse_args()


ARGS = parse_args()
from bertjax.runtime import tcmalloc  # noqa: E402
from timing import time_interleaved  # noqa: E402  (benchmarks/timing.py, beside this script)

tcmalloc.reexec_under_tcmalloc()  # as `python -m bertjax.finetune` runs; BERTJAX_NO_TCMALLOC=1 keeps glibc's
os.environ["XLA_FLAGS"] = (ARGS.xla_flags + " " + os.environ.get("XLA_FLAGS", "")).strip()

from bertjax.training import aot  # noqa: E402

aot.quiet_libtpu()  # libtpu, when installed on a machine without TPUs, need not look for TPU hosts
import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402

# Steps the schedules are built for: the timed steps sit inside warmup + decay, the learning rate is never 0.
SCHEDULE_STEPS, SCHEDULE_WARMUP = 1000, 100
LEARNING_RATE, WEIGHT_DECAY, EPS = 3e-5, 0.01, 1e-6


def make_batch(batch: int, seq: int, num_labels: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of S/2..S real tokens ([CLS] first) with padding, two segments, a random label each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq // 2, seq + 1, batch)
    pos = np.arange(seq)[None, :]
    input_mask = (pos < lengths[:, None]).astype(np.int32)
    input_ids = (rng.integers(1000, VOCAB, (batch, seq)) * input_mask).astype(np.int32)
    input_ids[:, 0] = 101
    segment_ids = ((pos >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    return dict(
        input_ids=input_ids,
        segment_ids=segment_ids,
        input_mask=input_mask,
        label=rng.integers(0, num_labels, batch).astype(np.int32),
        example_weight=np.ones((batch,), np.float32),
    )


def compute_dtype() -> str:
    if ARGS.dtype != "auto":
        return ARGS.dtype
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


# --- JAX --------------------------------------------------------------------------------------------


def jax_job():
    """configs/finetune.py as users get it (random initialisation of --model), with this benchmark's
    batch, sequence length and schedule."""
    import runpy

    from bertjax.finetuning.config import FinetuneConfig

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "finetune.py")
    c = runpy.run_path(path)["get_config"](f"size={ARGS.model}")
    c.model.vocab_size = VOCAB
    c.model.dtype = compute_dtype()
    if ARGS.scan_layers >= 0:
        c.model.scan_layers = bool(ARGS.scan_layers)
    c.data.train_file = "synthetic"  # never read: the benchmark feeds its own batch
    c.data.max_seq_length = ARGS.seq_len
    c.train.global_batch_size = ARGS.batch_size
    c.train.num_train_steps = SCHEDULE_STEPS
    c.optim.warmup_steps = SCHEDULE_WARMUP
    c.optim.learning_rate = LEARNING_RATE
    c.mesh.shape = (1, 1, 1)
    return FinetuneConfig.from_configdict(c)


def jax_runner(job, batch_np: dict):
    """bertjax's fine-tuning step — `trainer.setup` with the sequence-classification task, compiled ahead
    of time with donated state on a one-device mesh, as bertjax/finetune.py builds it — as a callable."""
    from bertjax.finetuning import heads
    from bertjax.training import trainer as trainer_lib

    def make_task(platform_name: str):
        model = heads.from_config(
            job.model, job.model.architecture, "sequence_classification", ARGS.num_labels, platform_name
        )
        return heads.task(model, "sequence_classification", False, ARGS.seq_len)

    t = time.perf_counter()
    trainer = trainer_lib.setup(job, jax.devices()[:1], task=make_task)
    info = dict(
        compile_s=time.perf_counter() - t,
        scan_layers=job.model.layer_scan(jax.default_backend()),
        remat_policy=job.model.remat_policy,
        attention=trainer.model.attention,
        optimizer=job.optim.name,
        max_grad_norm=job.optim.max_grad_norm,
    )
    batch = {
        k: jax.device_put(np.asarray(batch_np[k], v.dtype).reshape(v.shape), v.sharding)
        for k, v in trainer.batch_abstract.items()
    }
    holder = dict(state=trainer.init_state())

    def run() -> float:
        holder["state"], metrics = trainer.train_step(holder["state"], batch)
        return float(metrics["loss"][0])  # blocks until the step is done

    return run, info, trainer.task.flops_per_row


# --- PyTorch ----------------------------------------------------------------------------------------


def torch_runner(cfg, batch_np: dict):
    """transformers' BertForSequenceClassification with AdamW, a linear schedule and clipping at 1.0 (what
    a transformers fine-tune runs each step) as a zero-argument callable running one step."""
    import torch
    import transformers

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = compute_dtype() == "bfloat16"
    config = transformers.BertConfig(**cfg.to_dict(), num_labels=ARGS.num_labels, attn_implementation="sdpa")
    model = transformers.BertForSequenceClassification(config).to(device).train()
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [dict(params=decay, weight_decay=WEIGHT_DECAY), dict(params=no_decay, weight_decay=0.0)],
        lr=LEARNING_RATE,
        eps=EPS,
        **(dict(fused=True) if ARGS.torch_fused else {}),
    )
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, SCHEDULE_WARMUP, SCHEDULE_STEPS)
    kwargs = {
        k: torch.tensor(v, dtype=torch.long, device=device)
        for k, v in dict(
            input_ids=batch_np["input_ids"],
            token_type_ids=batch_np["segment_ids"],
            attention_mask=batch_np["input_mask"],
            labels=batch_np["label"],
        ).items()
    }

    def run() -> float:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**kwargs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # synchronises with the device

    return run, dict(
        attn_implementation=model.config._attn_implementation,
        device=device,
        autocast="bfloat16" if bf16 else None,
        adamw="fused" if ARGS.torch_fused else "default",
    )


def main():
    import torch
    import transformers

    default_threads = (torch.get_num_threads(), torch.get_num_interop_threads())
    torch.set_num_threads(ARGS.torch_threads or os.cpu_count())
    frameworks = ARGS.frameworks.split(",")
    t0 = time.perf_counter()
    job = jax_job()
    batch_np = make_batch(ARGS.batch_size, ARGS.seq_len, ARGS.num_labels)
    row = dict(
        model=ARGS.model,
        task="sequence_classification",
        num_labels=ARGS.num_labels,
        seq_len=ARGS.seq_len,
        batch_size=ARGS.batch_size,
        vocab=VOCAB,
        steps=ARGS.steps,
        warmup=ARGS.warmup,
        dtype=compute_dtype(),
        device=jax.devices()[0].device_kind,
        real_token_fraction=float(batch_np["input_mask"].mean()),
    )
    runners, infos, flops = {}, {}, None
    if "jax" in frameworks:
        runners["bertjax"], infos["bertjax"], per_row = jax_runner(job, batch_np)
        flops = per_row * ARGS.batch_size
    if "torch" in frameworks:
        runners["torch"], infos["torch"] = torch_runner(job.model.architecture, batch_np)
    res = time_interleaved(runners, ARGS.steps, ARGS.warmup)
    for name, r in res.items():
        row.update(
            {
                f"{name}_step_s": r["step_s"],
                f"{name}_step_min_max_s": [r["min_s"], r["max_s"]],
                f"{name}_step_times_s": r["times_s"],
                f"{name}_seq_per_s": ARGS.batch_size / r["step_s"],
                f"{name}_loss": r["loss"],
            }
        )
        if flops:
            row[f"{name}_achieved_tflops"] = flops / r["step_s"] / 1e12
        row.update({f"{name}_{k}": v for k, v in infos[name].items()})
    if len(res) == 2:
        row["speedup"] = res["torch"]["step_s"] / res["bertjax"]["step_s"]  # > 1: bertjax ahead
    if flops:
        row["model_tflops_per_step"] = flops / 1e12
    row.update(
        jax=jax.__version__,
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        cpu_count=os.cpu_count(),
        loadavg_1m=os.getloadavg()[0],
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        allocator="tcmalloc" if tcmalloc.active() else "system",
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        torch_default_threads=list(default_threads),
        elapsed_s=time.perf_counter() - t0,
    )
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
