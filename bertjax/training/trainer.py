"""What every job shares: model, optimizer, mesh, sharded abstract state and the compiled steps.

`setup(config, task=...)` builds them once, as MaxText's `setup_train_loop` and t5x's `Trainer` do, and
returns a frozen `Trainer`. What is trained is a `Task` (model, loss, batch): pre-training's, or a
fine-tuning head's (heads.py). The pre-training job (jobs/main.py), fine-tuning (finetune.py), the tests and
the benchmarks all build through it, so the step they run is the step the job runs.

State is created sharded: `jax.eval_shape` of the init gives shapes, the logical-axis rules give each
leaf a sharding, and a jitted init with those `out_shardings` materialises it in place, never whole on
one device. The train step is compiled ahead of time with donated state and its memory analysis logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Iterator, Optional, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.runtime import compile_cache
from bertjax.training import metrics as metrics_lib
from bertjax import models as models_lib
from bertjax.models import layers, partitioning
from bertjax.training import optim as optim_lib
from bertjax.training import sharding as sharding_lib
from bertjax.config.schema import JobConfig
from bertjax.data.pretraining import pipeline as pipeline_lib

log = logging.getLogger(__name__)
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any
    rng: jax.Array  # raw base key (uint32); dropout keys are folded from it by step and micro-batch


# --- Tasks -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """What a job trains: the model, its weighted (sum, count) metrics of a batch, the loss made from
    them, and the batch it reads. Pre-training is one task (`pretraining_task`); each fine-tuning head
    (heads.py) is another. The step, the state, the mesh and the checkpoints are the same for all."""

    model: nn.Module
    # (params, batch, dropout rng or None) → metrics as (sum, count) pairs; the loss terms among them
    forward_sums: Callable[[Any, Batch, Optional[jax.Array]], metrics_lib.Metrics]
    # The loss's denominators, from the whole batch before it is split into micro-batches, so that k
    # accumulated micro-batches give exactly the gradient of the whole batch.
    loss_denominators: Callable[[Batch], Any]
    loss: Callable[[metrics_lib.Metrics, Any], jax.Array]  # (summed metrics, denominators) → scalar
    batch_shapes: Callable[[int], dict[str, tuple[tuple[int, ...], Any]]]  # global batch → name → (shape, dtype)
    seq_len: int
    flops_per_row: float  # model FLOPs of one training row (forward + backward), for MFU
    predict: Optional[Callable[[Any, Batch], dict]] = None  # (params, batch) → per-row outputs, for host metrics
    tokens_per_row: Optional[float] = None  # the tokens a batch row is given, for tokens/s and padding (seq_len)
    # A loss that couples the batch's rows (contrastive: every row's negatives are the others'): (params, batch,
    # rng, micro_batches) → ((loss, sums), grads) of the whole batch, the micro-batches its own business
    # (finetuning/contrastive.py's cached gradient). None: the micro-batches' losses are summed, as above.
    value_and_grad: Optional[Callable[[Any, Batch, jax.Array, int], tuple[tuple[jax.Array, Any], Any]]] = None


def _pretraining_sums(model: nn.Module, nsp: bool, params: Any, batch: Batch, rng: Optional[jax.Array]) -> dict:
    """Weighted (sum, count) metrics of one batch; dropout on when rng is given. Packed rows carry
    per-instance positions (and, for NSP, [CLS] positions and one NSP term per instance)."""
    family = models_lib.of(model.config)
    out = model.apply(
        {"params": params},
        input_ids=batch["input_ids"],
        segment_ids=batch["segment_ids"],
        input_mask=batch["input_mask"],
        masked_lm_positions=batch["masked_lm_positions"],
        deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng},
        **family.model.pretraining_inputs(batch),
    )
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    sums = metrics_lib.pretraining_metrics(
        out.mlm_logits,
        batch["masked_lm_ids"],
        batch["masked_lm_weights"],
        out.nsp_logits if nsp else None,
        batch["next_sentence_labels"],
        weight,
        batch.get("next_sentence_weights"),
        constant_prediction=rng is None,
    )  # evals only: whether a collapsed model predicts one token
    packed = "position_ids" in batch
    instances = jnp.sum(batch["next_sentence_weights"] * weight[:, None]) if packed else jnp.sum(weight)
    return dict(sums, **row_counts(batch, instances))


def row_counts(batch: Batch, instances: Optional[jax.Array] = None) -> dict:
    """Per row, for the log: instances (seq/s counts them; one per row unless packed) and real tokens
    (tokens/s, padding)."""
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    rows = jnp.sum(weight)
    real = jnp.sum((batch["input_mask"] > 0) * weight[:, None])
    return dict(instances_per_row=(rows if instances is None else instances, rows), real_tokens_per_row=(real, rows))


def _pretraining_denominators(batch: Batch) -> tuple[jax.Array, jax.Array]:
    weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
    mlm_count = jnp.sum(batch["masked_lm_weights"] * weight[:, None])
    nsp_count = (
        jnp.sum(batch["next_sentence_weights"] * weight[:, None])
        if "next_sentence_weights" in batch
        else jnp.sum(weight)
    )
    return mlm_count, nsp_count


def pretraining_task(config: JobConfig, platform: Optional[str] = None) -> Task:
    """Masked LM (+ next sentence prediction) on the records of `config.data`, for a mesh on `platform`."""
    data = config.data
    model = models_lib.get(config.model.family).model.from_config(config.model, platform=platform, packed=data.packing)
    return Task(
        model=model,
        forward_sums=functools.partial(_pretraining_sums, model, data.next_sentence_prediction),
        loss_denominators=_pretraining_denominators,
        loss=lambda sums, counts: metrics_lib.pretraining_loss(sums, *counts),
        batch_shapes=lambda n: pipeline_lib.batch_shapes(
            n, data.max_seq_length, data.record_predictions, data.record_instances
        ),
        seq_len=data.max_seq_length,
        flops_per_row=metrics_lib.flops_per_sequence(
            config.model.architecture, data.max_seq_length, data.max_predictions_per_seq
        ),
    )


# --- The steps ---------------------------------------------------------------------------------------


def make_train_step(
    task: Task,
    tx: optax.GradientTransformation,
    micro_batches: int,
    learning_rate: Callable[[jax.Array], jax.Array],
    compute_shardings: Any = None,
    skip_empty_micro_batches: bool = False,
) -> Callable:
    """(state, batch) → (state, metrics). Gradients are summed over micro-batches inside the step.

    A step whose loss or gradient norm is not finite changes nothing but the step count (the batch is
    consumed); its `nonfinite` metric is 1 and its other metrics are zero, so the host can count it and
    apply `config.train.on_nonfinite`.

    `compute_shardings` (sharding.gathered_for_compute of the parameter shardings), when given, is how
    the parameters are laid out for the forward and backward pass.

    The loss takes the *whole* batch's denominators (`task.loss_denominators`) in every micro-batch:
    accumulating k micro-batches gives exactly the gradient of one batch k times larger.

    `skip_empty_micro_batches` (batch-size warmup, batch_warmup.py): a micro-batch whose example weights are
    all 0 adds zeros instead of its gradient, computed under a `lax.cond` that does not run the model.
    """

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        denominators = task.loss_denominators(batch)
        step_rng = jax.random.fold_in(state.rng, state.step)

        def loss_fn(params, micro, rng):
            if compute_shardings is not None:
                params = jax.lax.with_sharding_constraint(params, compute_shardings)
            sums = task.forward_sums(params, micro, rng)
            return task.loss(sums, denominators), sums

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if task.value_and_grad is not None:
            params = state.params
            if compute_shardings is not None:
                params = jax.lax.with_sharding_constraint(params, compute_shardings)
            (loss, sums), grads = task.value_and_grad(params, batch, step_rng, micro_batches)
        elif micro_batches == 1:
            (loss, sums), grads = grad_fn(state.params, batch, step_rng)
        else:
            # Micro-batch i takes rows i, i+k, i+2k, …: each device keeps its own rows (no resharding).
            split = jax.tree.map(lambda x: jnp.swapaxes(x.reshape((-1, micro_batches) + x.shape[1:]), 0, 1), batch)

            def accumulate(carry, inputs):
                index, micro = inputs
                if skip_empty_micro_batches:

                    def empty(params, micro, rng):
                        return jax.tree.map(jnp.zeros_like, ((carry[0], carry[1]), carry[2]))

                    (loss_i, sums_i), grads_i = jax.lax.cond(
                        jnp.any(micro[pipeline_lib.EXAMPLE_WEIGHT] > 0),
                        grad_fn,
                        empty,
                        state.params,
                        micro,
                        jax.random.fold_in(step_rng, index),
                    )
                else:
                    (loss_i, sums_i), grads_i = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
                loss, sums, grads = carry
                return (loss + loss_i, jax.tree.map(jnp.add, sums, sums_i), jax.tree.map(jnp.add, grads, grads_i)), None

            zero_sums = jax.eval_shape(
                lambda: task.forward_sums(state.params, jax.tree.map(lambda x: x[0], split), step_rng)
            )  # a train step's sums (rng given)
            init = (
                jnp.zeros((), jnp.float32),
                jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_sums),
                jax.tree.map(jnp.zeros_like, state.params),
            )
            (loss, sums, grads), _ = jax.lax.scan(accumulate, init, (jnp.arange(micro_batches), split))
        # Named, so that a profile (benchmarks/profile_summary.py) tells the update's time from the model's.
        with jax.named_scope("optimizer"):
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            # The guard: a step whose loss or gradients are not finite leaves params and optimizer state as
            # they were (optax.apply_if_finite's rule, without its extra state). The gradient norm is needed
            # for clipping anyway, so the check costs one scalar and the selects fuse into the update.
            grad_norm = optax.global_norm(grads)
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            params, opt_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (params, opt_state), (state.params, state.opt_state)
            )
        one = jnp.ones((), jnp.float32)
        # A skipped step's loss and accuracies stay out of the logged means; the host counts the skips.
        metrics = jax.tree.map(
            lambda x: jnp.where(finite, x, jnp.zeros_like(x)), dict(sums, loss=(loss, one), grad_norm=(grad_norm, one))
        )
        metrics.update(
            learning_rate=(learning_rate(state.step), one), nonfinite=(1.0 - finite.astype(jnp.float32), one)
        )
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


def make_eval_step(forward: Callable[[Any, Batch], Any], compute_shardings: Any = None) -> Callable:
    """(params, batch) → forward(params, batch), with the parameters laid out for compute."""

    def step(params, batch):
        if compute_shardings is not None:
            params = jax.lax.with_sharding_constraint(params, compute_shardings)
        return forward(params, batch)

    return step


# --- State -------------------------------------------------------------------------------------------


def initial_step_and_rng(seed: int) -> tuple[jax.Array, jax.Array]:
    """A fresh state's step (0) and dropout key: one derivation for a random init and for init_from."""
    return jnp.zeros((), jnp.int32), jax.random.fold_in(jax.random.PRNGKey(seed), 1)


def sharded_state(
    model: nn.Module,
    tx: optax.GradientTransformation,
    seed: int,
    seq_len: int,
    mesh: jax.sharding.Mesh,
    rules: sharding_lib.Rules,
) -> tuple[TrainState, TrainState, Callable]:
    """(abstract state with shardings, shardings, jitted init that creates the state already sharded)."""
    dummy_inputs = models_lib.of(model.config).model.dummy_inputs(1, seq_len)

    def create() -> TrainState:
        params = nn.meta.unbox(model.init(jax.random.PRNGKey(seed), **dummy_inputs)["params"])
        step, rng = initial_step_and_rng(seed)
        return TrainState(step=step, params=params, opt_state=tx.init(params), rng=rng)

    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **dummy_inputs)["params"])
    param_shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    opt_abstract = jax.eval_shape(tx.init, nn.meta.unbox(boxed))
    replicated = sharding_lib.replicated(mesh)
    shardings = TrainState(
        step=replicated,
        params=param_shardings,
        opt_state=sharding_lib.optimizer_shardings(tx, opt_abstract, param_shardings, mesh),
        rng=replicated,
    )
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), jax.eval_shape(create), shardings
    )
    jitted = jax.jit(create, out_shardings=shardings)

    def init() -> TrainState:
        # XLA:GPU inlines every initialiser's threefry hash into its own kernels: an H200 spent ~200 s
        # compiling the init of BERT-Base's 12 unrolled layers, against ~5 s on the CPU. jax's own threefry
        # kernel gives the same bits and is meant to spare that compile (benchmarks/gpu_profile.py reports
        # init_s for each variant); the flag changes nothing off the GPU.
        previous = jax.config.jax_threefry_gpu_kernel_lowering
        jax.config.update("jax_threefry_gpu_kernel_lowering", True)
        try:
            return jitted()
        finally:
            jax.config.update("jax_threefry_gpu_kernel_lowering", previous)

    return abstract, shardings, init


def jit_train_step(step_fn: Callable, shardings: TrainState, batch_abstract: dict, mesh: jax.sharding.Mesh) -> Any:
    """The train step jitted with explicit shardings and donated state (not yet lowered)."""
    batch_shardings = {k: v.sharding for k, v in batch_abstract.items()}
    return jax.jit(
        step_fn,
        in_shardings=(shardings, batch_shardings),
        out_shardings=(shardings, sharding_lib.replicated(mesh)),
        donate_argnums=0,
    )


def memory_bytes(compiled: Any) -> Optional[dict[str, int]]:
    """Per-device bytes of a compiled program (`memory_analysis`), or None where the backend has none.

    `total` counts the donated state once: outputs aliased with arguments share their buffers."""
    try:
        mem = compiled.memory_analysis()
    except (NotImplementedError, AttributeError):
        mem = None
    if mem is None:
        return None
    out = dict(
        argument=mem.argument_size_in_bytes,
        output=mem.output_size_in_bytes,
        alias=mem.alias_size_in_bytes,
        temp=mem.temp_size_in_bytes,
        code=mem.generated_code_size_in_bytes,
    )
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["code"]
    return out


@contextlib.contextmanager
def tracing(mesh: jax.sharding.Mesh, rules: sharding_lib.Rules) -> Iterator[None]:
    """What a step is traced under: the mesh's activation rules, and on CPUs bf16 weight matmuls that accumulate in
    float32 (the form XLA:CPU runs natively: layers.bf16_dots_accumulate_f32)."""
    cpu = mesh.devices.flat[0].platform == "cpu"
    with partitioning.activation_rules(mesh, rules), layers.bf16_dots_accumulate_f32(cpu):
        yield


def compile_train_step(
    jitted: Any,
    abstract: TrainState,
    batch_abstract: dict,
    mesh: jax.sharding.Mesh,
    rules: sharding_lib.Rules,
    compiler_options: Optional[dict] = None,
) -> Any:
    """Lowers and compiles the jitted step ahead of time; logs the time taken and the memory per device.

    Traced under the mesh and the logical-axis rules, so that the model's activation constraints
    (`partitioning.constrain`) pin activations to the batch axes instead of leaving the partitioner to
    guess from the parameters."""
    start, hits = time.perf_counter(), compile_cache.hits()
    with tracing(mesh, rules):
        compiled = jitted.lower(abstract, batch_abstract).compile(compiler_options)
    seconds = time.perf_counter() - start
    if compile_cache.hits() > hits:
        log.info("compile: train step loaded from the compilation cache in %.1fs", seconds)
    else:
        log.info("compile: train step compiled in %.1fs", seconds)
    mem = memory_bytes(compiled)
    if mem is None:
        log.info("compile: memory analysis not available on %s", mesh.devices.flat[0].platform)
    else:
        gib = 2**30
        log.info(
            "compile: per-device memory — arguments %.3f GiB, outputs %.3f GiB, temporaries %.3f GiB, "
            "code %.3f GiB (arguments aliased with outputs: %.3f GiB)",
            mem["argument"] / gib,
            mem["output"] / gib,
            mem["temp"] / gib,
            mem["code"] / gib,
            mem["alias"] / gib,
        )
    return compiled


# --- The trainer -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trainer:
    """Everything a job needs to run steps of `task` on `mesh`; build it with `setup`."""

    config: Any  # the job's config (JobConfig, or finetune's FinetuneConfig): train, optim, mesh, seed
    task: Task
    tx: optax.GradientTransformation
    learning_rate: optax.Schedule
    mesh: jax.sharding.Mesh
    rules: sharding_lib.Rules
    abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings
    state_shardings: TrainState
    batch_abstract: dict[str, jax.ShapeDtypeStruct]  # the global batch, with its shardings
    jitted_train_step: Any  # jax.jit of the step with its shardings (compile_step lowers and compiles it)
    train_step: Any  # compiled: (state, global batch) → (state, metrics), the state donated; None if not compiled
    init_state: Callable[[], TrainState]  # a fresh state, created sharded
    _eval_step: Callable = dataclasses.field(repr=False)
    _predict_step: Optional[Callable] = dataclasses.field(default=None, repr=False)

    @property
    def model(self) -> nn.Module:
        return self.task.model

    def compile_step(self, compiler_options: Optional[dict] = None) -> Any:
        """The train step lowered and compiled for this mesh (what `setup` does unless compile=False);
        `compiler_options`: XLA's DebugOptions for this compile (e.g. gpu_targets.COMPILER_OPTIONS)."""
        return compile_train_step(
            self.jitted_train_step, self.abstract_state, self.batch_abstract, self.mesh, self.rules, compiler_options
        )

    def global_batch(self, local: dict[str, np.ndarray]) -> Batch:
        """Every process's host batch → one global batch sharded over the mesh's batch axes."""
        return sharding_lib.global_batch(local, self.mesh, self.rules)

    def eval_step(self, params: Any, batch: Batch) -> metrics_lib.Metrics:
        """(sum, count) metrics of a global batch, without dropout."""
        with tracing(self.mesh, self.rules):  # the first call traces the step
            return self._eval_step(params, batch)

    def predict_step(self, params: Any, batch: Batch) -> dict[str, np.ndarray]:
        """`task.predict` of a global batch (every row, on every process), without dropout."""
        if self._predict_step is None:
            raise ValueError("this task has no predict function")
        with tracing(self.mesh, self.rules):
            out = self._predict_step(params, batch)
        # Replicated: every process holds the whole value (device_get refuses arrays spanning processes).
        return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), out)

    def state_from_params(self, params: Any) -> TrainState:
        """A fresh state (step 0, new optimizer state) around host `params` (`config.train.init_from`)."""
        from bertjax.training import checkpoint as checkpoint_lib

        params = checkpoint_lib.place(params, self.state_shardings.params)
        opt_state = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)(params)
        # Without building (and compiling) a random model to drop, as init_state would.
        step, rng = jax.jit(
            functools.partial(initial_step_and_rng, self.config.seed),
            out_shardings=(self.state_shardings.step, self.state_shardings.rng),
        )()
        return TrainState(step=step, params=params, opt_state=opt_state, rng=rng)


def process_batch_size(train: Any) -> int:
    """Rows of the global batch each process feeds (its input pipeline's batch size)."""
    if train.global_batch_size % jax.process_count():
        raise ValueError(
            f"config.train.global_batch_size={train.global_batch_size} must divide by the "
            f"process count {jax.process_count()}."
        )
    return train.global_batch_size // jax.process_count()


def check_layout(config: Any, devices: Optional[Sequence[jax.Device]] = None) -> Any:
    """The global batch, the processes and the mesh agree (one ValueError naming the setting otherwise); the mesh.
    Jobs call it before any data work, so that a mismatch is not found after minutes of preparing records."""
    train = config.train
    process_batch_size(train)
    mesh = sharding_lib.make_mesh(config.mesh.shape, devices)
    split = sharding_lib.batch_axis_size(mesh, config.mesh.logical_axis_rules)
    if (train.global_batch_size // train.micro_batches) % split:
        raise ValueError(
            f"config.train.global_batch_size / micro_batches = "
            f"{train.global_batch_size // train.micro_batches} must divide by the {split} ways the "
            f"batch is split over mesh {dict(mesh.shape)}."
        )
    return mesh


def setup(
    config: Any,
    devices: Optional[Sequence[jax.Device]] = None,
    compile: bool = True,
    task: Optional[Callable[[str], Task]] = None,
) -> Trainer:
    """Model, optimizer, mesh over `devices` (default: all), sharded abstract state, compiled train step
    (with compile=False only jitted: `aot` lowers it for a TPU topology and reads what compiling says).

    `task(platform)` builds what is trained for the mesh's platform; default: pre-training on
    `config.data`. `config` needs `seed`, `train` (global_batch_size, micro_batches, num_train_steps),
    `optim` and `mesh`. Errors a user can cause (a batch the mesh or the processes cannot split) are one
    ValueError."""
    train = config.train
    rules = config.mesh.logical_axis_rules
    mesh = check_layout(config, devices)
    platform = mesh.devices.flat[0].platform
    task = task(platform) if task is not None else pretraining_task(config, platform)
    tx = optim_lib.make_optimizer(config.optim, train.num_train_steps)
    learning_rate = optim_lib.schedule(config.optim, train.num_train_steps)
    abstract, shardings, init = sharded_state(task.model, tx, config.seed, task.seq_len, mesh, rules)
    batch_abstract = {
        name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding_lib.batch_sharding(mesh, rules, len(shape)))
        for name, (shape, dtype) in task.batch_shapes(train.global_batch_size).items()
    }
    batch_shardings = {k: v.sharding for k, v in batch_abstract.items()}
    compute_shardings = sharding_lib.gathered_for_compute(shardings.params)
    jitted = jit_train_step(
        make_train_step(
            task,
            tx,
            train.micro_batches,
            learning_rate,
            compute_shardings,
            skip_empty_micro_batches=getattr(train, "batch_warmup_tokens", 0) > 0,
        ),
        shardings,
        batch_abstract,
        mesh,
    )

    def jit_eval(forward: Callable) -> Callable:
        return jax.jit(
            make_eval_step(forward, compute_shardings),
            in_shardings=(shardings.params, batch_shardings),
            out_shardings=sharding_lib.replicated(mesh),
        )

    trainer = Trainer(
        config=config,
        task=task,
        tx=tx,
        learning_rate=learning_rate,
        mesh=mesh,
        rules=rules,
        abstract_state=abstract,
        state_shardings=shardings,
        batch_abstract=batch_abstract,
        jitted_train_step=jitted,
        train_step=None,
        init_state=init,
        _eval_step=jit_eval(lambda params, batch: task.forward_sums(params, batch, None)),
        _predict_step=jit_eval(task.predict) if task.predict is not None else None,
    )
    return dataclasses.replace(trainer, train_step=trainer.compile_step()) if compile else trainer
