"""`train_and_evaluate(config, workdir)`: the pre-training job, in phases under banners.

setup → data → mesh → state (created sharded) → compile (ahead of time) → restore → loop
(train step / log / eval / checkpoint), then a final eval and checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import time
from typing import Any, Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import checkpoint as checkpoint_lib
from bertjax import metrics as metrics_lib
from bertjax import model as model_lib
from bertjax import optim as optim_lib
from bertjax import sharding as sharding_lib
from bertjax.data import pipeline as pipeline_lib

log = logging.getLogger("bertjax")
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any
    rng: jax.Array  # raw base key (uint32); dropout keys are folded from it by step and micro-batch


# --- Settings: the ConfigDict becomes frozen dataclasses here, once -----------------------------------

@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int
    global_batch_size: int
    micro_batches: int
    num_train_steps: int
    log_every_steps: int
    init_from: str
    phase: int
    eval_every_steps: int
    eval_batches: int  # 0: the whole eval set
    train_files: str
    eval_files: str
    max_seq_length: int
    max_predictions_per_seq: int
    nsp: bool
    shuffle_buffer: int
    dynamic_masking: bool
    vocab_file: str
    do_lower_case: bool
    mesh_shape: tuple[int, ...]
    rules: tuple[tuple[str, Any], ...]

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict) -> "RunConfig":
        rules = sharding_lib.rules_from_config(c.mesh)
        run = cls(seed=int(c.seed), global_batch_size=int(c.train.global_batch_size),
                  micro_batches=int(c.train.micro_batches), num_train_steps=int(c.train.num_train_steps),
                  log_every_steps=int(c.train.log_every_steps), init_from=str(c.train.init_from),
                  phase=int(c.train.phase),
                  eval_every_steps=int(c.eval.every_steps), eval_batches=int(c.eval.num_batches),
                  train_files=str(c.data.train_files), eval_files=str(c.data.eval_files),
                  max_seq_length=int(c.data.max_seq_length),
                  max_predictions_per_seq=int(c.data.max_predictions_per_seq),
                  nsp=bool(c.data.next_sentence_prediction), shuffle_buffer=int(c.data.shuffle_buffer),
                  dynamic_masking=bool(c.data.dynamic_masking), vocab_file=str(c.data.vocab_file),
                  do_lower_case=bool(c.data.do_lower_case), mesh_shape=tuple(c.mesh.shape), rules=rules)
        run.validate(c)
        return run

    def validate(self, c: ml_collections.ConfigDict) -> None:
        for name, value in (("train.global_batch_size", self.global_batch_size),
                            ("train.micro_batches", self.micro_batches),
                            ("train.num_train_steps", self.num_train_steps),
                            ("train.log_every_steps", self.log_every_steps),
                            ("eval.every_steps", self.eval_every_steps)):
            if value < 1:
                raise ValueError(f"config.{name}={value} must be ≥ 1.")
        if self.eval_batches < 0:
            raise ValueError(f"config.eval.num_batches={self.eval_batches} must be ≥ 0 (0 = the whole eval set).")
        if self.global_batch_size % self.micro_batches:
            raise ValueError(f"config.train.global_batch_size={self.global_batch_size} must divide by "
                             f"config.train.micro_batches={self.micro_batches}.")
        if self.global_batch_size % jax.process_count():
            raise ValueError(f"config.train.global_batch_size={self.global_batch_size} must divide by the "
                             f"process count {jax.process_count()}.")
        if self.max_seq_length > c.model.max_position_embeddings:
            raise ValueError(f"config.data.max_seq_length={self.max_seq_length} exceeds "
                             f"config.model.max_position_embeddings={c.model.max_position_embeddings}.")
        if self.phase not in (1, 2):
            raise ValueError(f"config.train.phase={self.phase} must be 1 or 2.")
        if self.phase == 2 and not self.init_from:
            raise ValueError("config.train.phase=2 continues phase 1: set config.train.init_from to phase 1's "
                             "workdir (e.g. configs/large.py:phase=2,init_from=/ckpt/large-phase1).")
        if self.dynamic_masking and not self.vocab_file:
            raise ValueError("config.data.dynamic_masking=True re-masks with the records' vocabulary: set "
                             "config.data.vocab_file to the vocab the records were made with.")
        if not self.train_files:
            raise ValueError("config.data.train_files is empty; point it at record shards made by "
                             "`python -m bertjax.prepare` (a glob or comma list), or set config.data.corpus.")

    @property
    def local_batch_size(self) -> int:
        return self.global_batch_size // jax.process_count()


# --- The steps ---------------------------------------------------------------------------------------

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels", pipeline_lib.EXAMPLE_WEIGHT)


def batch_shapes(batch_size: int, seq_len: int, predictions: int) -> dict[str, jax.ShapeDtypeStruct]:
    shapes = {"input_ids": (seq_len,), "input_mask": (seq_len,), "segment_ids": (seq_len,),
              "masked_lm_positions": (predictions,), "masked_lm_ids": (predictions,),
              "masked_lm_weights": (predictions,), "next_sentence_labels": (), pipeline_lib.EXAMPLE_WEIGHT: ()}
    return {k: jax.ShapeDtypeStruct((batch_size,) + s,
                                    jnp.float32 if k in ("masked_lm_weights", pipeline_lib.EXAMPLE_WEIGHT)
                                    else jnp.int32) for k, s in shapes.items()}


def _forward_sums(model: nn.Module, params: Any, batch: Batch, nsp: bool, rng: Optional[jax.Array]) -> dict:
    """Weighted (sum, count) metrics of one batch; dropout on when rng is given."""
    out = model.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      masked_lm_positions=batch["masked_lm_positions"], deterministic=rng is None,
                      rngs=None if rng is None else {"dropout": rng})
    return metrics_lib.pretraining_metrics(
        out.mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"],
        out.nsp_logits if nsp else None, batch["next_sentence_labels"], batch[pipeline_lib.EXAMPLE_WEIGHT])


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, micro_batches: int, nsp: bool,
                    learning_rate: Callable[[jax.Array], jax.Array], compute_shardings: Any = None) -> Callable:
    """(state, batch) → (state, metrics). Gradients are summed over micro-batches inside the step.

    `compute_shardings` (sharding.gathered_for_compute of the parameter shardings), when given, is how
    the parameters are laid out for the forward and backward pass.

    The loss is mean MLM cross-entropy over the weighted masked positions of the *whole* batch plus
    mean NSP cross-entropy over its examples; every micro-batch divides by the whole batch's totals, so
    accumulating k micro-batches gives exactly the gradient of one batch k times larger.
    """

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        weight = batch[pipeline_lib.EXAMPLE_WEIGHT]
        mlm_total = jnp.maximum(jnp.sum(batch["masked_lm_weights"] * weight[:, None]), 1e-5)
        nsp_total = jnp.maximum(jnp.sum(weight), 1e-5)
        step_rng = jax.random.fold_in(state.rng, state.step)

        def loss_fn(params, micro, rng):
            if compute_shardings is not None:
                params = jax.lax.with_sharding_constraint(params, compute_shardings)
            sums = _forward_sums(model, params, micro, nsp, rng)
            loss = sums["mlm_loss"][0] / mlm_total
            if nsp:
                loss = loss + sums["nsp_loss"][0] / nsp_total
            return loss, sums

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if micro_batches == 1:
            (loss, sums), grads = grad_fn(state.params, batch, step_rng)
        else:
            # Micro-batch i takes rows i, i+k, i+2k, …: each device keeps its own rows (no resharding).
            split = jax.tree.map(lambda x: jnp.swapaxes(x.reshape((-1, micro_batches) + x.shape[1:]), 0, 1), batch)

            def accumulate(carry, inputs):
                index, micro = inputs
                (loss_i, sums_i), grads_i = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
                loss, sums, grads = carry
                return (loss + loss_i, jax.tree.map(jnp.add, sums, sums_i), jax.tree.map(jnp.add, grads, grads_i)), None

            zero_sums = jax.eval_shape(lambda: _forward_sums(model, state.params, jax.tree.map(lambda x: x[0], split),
                                                             nsp, None))
            init = (jnp.zeros((), jnp.float32), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_sums),
                    jax.tree.map(jnp.zeros_like, state.params))
            (loss, sums, grads), _ = jax.lax.scan(accumulate, init, (jnp.arange(micro_batches), split))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(sums, loss=(loss, jnp.ones((), jnp.float32)),
                       grad_norm=(optax.global_norm(grads), jnp.ones((), jnp.float32)),
                       learning_rate=(learning_rate(state.step), jnp.ones((), jnp.float32)))
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


def make_eval_step(model: nn.Module, nsp: bool, compute_shardings: Any = None) -> Callable:
    def step(params, batch):
        if compute_shardings is not None:
            params = jax.lax.with_sharding_constraint(params, compute_shardings)
        return _forward_sums(model, params, batch, nsp, None)

    return step


# --- Building blocks of the job ----------------------------------------------------------------------

def init_state(model: nn.Module, tx: optax.GradientTransformation, rng: jax.Array, seq_len: int) -> TrainState:
    params = model.init(rng, **model_lib.dummy_inputs(1, seq_len))["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(nn.meta.unbox(params)),
                      rng=jax.random.fold_in(rng, 1))


def abstract_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, seq_len: int,
                   mesh: jax.sharding.Mesh, rules) -> tuple[TrainState, TrainState, Callable]:
    """(abstract state with shardings, shardings, jitted init that creates it already sharded)."""
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **model_lib.dummy_inputs(1, seq_len))["params"])
    param_shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    opt_abstract = jax.eval_shape(tx.init, nn.meta.unbox(boxed))
    replicated = sharding_lib.replicated(mesh)
    shardings = TrainState(step=replicated, params=param_shardings,
                           opt_state=sharding_lib.optimizer_shardings(tx, opt_abstract, param_shardings, mesh),
                           rng=replicated)

    def create() -> TrainState:
        state = init_state(model, tx, jax.random.PRNGKey(seed), seq_len)
        return state.replace(params=nn.meta.unbox(state.params))

    init = jax.jit(create, out_shardings=shardings)
    abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            jax.eval_shape(create), shardings)
    return abstract, shardings, init


def load_init_from(path: str, model: model_lib.BertForPreTraining) -> dict:
    """Weights only (host arrays, the model's layout) from a Hugging Face directory or a bertjax workdir."""
    from bertjax import hf

    if checkpoint_lib.is_workdir(path):
        fingerprint, params = checkpoint_lib.load_params(path)
        arch = model_lib.BertConfig(**fingerprint["model"])
    elif os.path.isfile(os.path.join(path, hf.CONFIG_NAME)):
        loaded, params = hf.from_pretrained(path)
        arch, params = loaded.config, jax.device_get(params)
    else:
        raise FileNotFoundError(f"config.train.init_from={path} is neither a bertjax workdir (with "
                                f"{checkpoint_lib.CHECKPOINTS}/) nor a Hugging Face directory (with config.json).")
    if arch != model.config:
        diff = [f for f in model_lib.CONFIG_FIELDS if getattr(arch, f) != getattr(model.config, f)]
        raise ValueError(f"config.train.init_from={path} holds a different model ({', '.join(f'{f}={getattr(arch, f)}' for f in diff)}"
                         f"); set config.model to match it.")
    if model.scan_layers:
        params = model_lib.stack_layers(params, arch.num_hidden_layers)
    return params


def compile_step(step_fn: Callable, abstract: TrainState, shardings: TrainState, batch_abstract: dict,
                 batch_shardings: dict, mesh: jax.sharding.Mesh, rules: sharding_lib.Rules) -> Any:
    """The train step jitted with explicit shardings and donated state, compiled ahead of time.

    Traced under the mesh and the logical-axis rules, so that the model's activation constraints
    (`nn.with_logical_constraint`) pin activations to the batch axes instead of leaving the
    partitioner to guess from the parameters."""
    jitted = jax.jit(step_fn, in_shardings=(shardings, batch_shardings),
                     out_shardings=(shardings, sharding_lib.replicated(mesh)), donate_argnums=0)
    start = time.perf_counter()
    with sharding_lib.activation_rules(mesh, rules):
        compiled = jitted.lower(abstract, batch_abstract).compile()
    log.info("compile: train step compiled in %.1fs", time.perf_counter() - start)
    try:
        mem = compiled.memory_analysis()
        if mem is not None:
            gib = 2**30
            log.info("compile: per-device memory — arguments %.3f GiB, outputs %.3f GiB, temporaries %.3f GiB, "
                     "code %.3f GiB (arguments aliased with outputs: %.3f GiB)",
                     mem.argument_size_in_bytes / gib, mem.output_size_in_bytes / gib,
                     mem.temp_size_in_bytes / gib, mem.generated_code_size_in_bytes / gib,
                     mem.alias_size_in_bytes / gib)
    except (NotImplementedError, AttributeError):  # some backends do not report it
        log.info("compile: memory analysis not available on %s", jax.default_backend())
    return compiled


class _Stop:
    """Turns SIGTERM into 'save at the next step and exit 0'."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        def handler(signum, frame):
            log.warning("received signal %d: saving a checkpoint after this step, then exiting", signum)
            self.requested = True
        try:
            self._previous = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread: no signal handling
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))


def _host(tree: Any) -> dict[str, float]:
    return metrics_lib.normalize(jax.device_get(tree))


def _pipeline(run: RunConfig, files: str, training: bool, vocab_size: int) -> pipeline_lib.InputPipeline:
    vocab = None
    if training and run.dynamic_masking:  # the masker needs [MASK], the specials and word-piece boundaries
        from bertjax.data import prepare as prepare_lib
        from bertjax.data import tokenizer as tokenizer_lib

        vocab = prepare_lib.vocab_for_masking(tokenizer_lib.load(run.vocab_file, run.do_lower_case))
    return pipeline_lib.InputPipeline(pipeline_lib.PipelineConfig(
        files=files, batch_size=run.local_batch_size, max_seq_length=run.max_seq_length,
        max_predictions_per_seq=run.max_predictions_per_seq, seed=run.seed, shuffle_buffer=run.shuffle_buffer,
        training=training, process_index=jax.process_index(), process_count=jax.process_count(),
        vocab_size=vocab_size, max_batches=None if training else (run.eval_batches or None),
        dynamic_masking=vocab is not None, vocab=vocab))


def evaluate(eval_step: Callable, params: Any, pipeline: pipeline_lib.InputPipeline, num_batches: int,
             mesh: jax.sharding.Mesh, rules) -> dict[str, float]:
    pipeline.reset()
    total = None
    for _, local in zip(range(num_batches), pipeline):
        with sharding_lib.activation_rules(mesh, rules):  # the first call traces the step
            sums = eval_step(params, sharding_lib.global_batch(local, mesh, rules))
        total = metrics_lib.merge(total, sums)
    return _host(total)


def show_predictions(model: nn.Module, params: Any, eval_data: pipeline_lib.InputPipeline,
                     config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
    """Prints the top-5 guesses for the masked words of a few held-out sequences."""
    from bertjax import predict
    from bertjax.data import tokenizer as tokenizer_lib

    eval_data.reset()
    batch = next(eval_data)
    tokenizer = tokenizer_lib.load(config.data.vocab_file, config.data.do_lower_case)
    host_params = jax.device_get(params)
    top_ids, top_probs = predict.top_k_predictions(model, host_params, batch)
    print("Top-5 predictions for the masked words of held-out sequences (✓: the top guess is right):")
    print(predict.format_predictions(tokenizer, batch, top_ids, top_probs, rows=config.eval.show_predictions))


# --- The job -----------------------------------------------------------------------------------------

def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, compile_only: bool = False) -> dict:
    """Runs (or resumes) the configured pre-training job in workdir; returns the last eval metrics."""
    # ===== setup =====
    from bertjax.data import stage as stage_lib  # corpus → vocab → records, when the config asks for it

    config = stage_lib.prepare_data(config, workdir)
    run = RunConfig.from_config(config)
    model = model_lib.from_config(config.model)
    optim = optim_lib.OptimConfig.from_config(config.optim)
    tx = optim_lib.make_optimizer(optim, run.num_train_steps)
    learning_rate = optim_lib.schedule(optim, run.num_train_steps)
    primary = jax.process_index() == 0
    if primary:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    log.info("setup: %d process(es), %d device(s) (%s), model %s: %s", jax.process_count(), jax.device_count(),
             jax.default_backend(), config.model.size, model.config)

    # ===== data =====
    # The schema check runs here, before compilation: a mismatched record set is one clear error.
    train_data = _pipeline(run, run.train_files, True, model.config.vocab_size)
    eval_data = _pipeline(run, run.eval_files, False, model.config.vocab_size) if run.eval_files else None
    eval_batches = 0
    if eval_data is not None:
        eval_batches = eval_data.num_batches  # config.eval.num_batches at most
        baselines = metrics_lib.baselines(b for _, b in zip(range(eval_batches), eval_data))
        log.info("data: eval baselines %s", {k: round(v, 4) for k, v in baselines.items()})
    else:
        baselines = {}

    writer = metrics_lib.MetricWriter(workdir, is_primary=primary)  # after the pipelines: TF stays off GPUs

    # ===== mesh =====
    mesh = sharding_lib.make_mesh(run.mesh_shape)
    split = sharding_lib.batch_axis_size(mesh, run.rules)
    if (run.global_batch_size // run.micro_batches) % split:
        raise ValueError(f"config.train.global_batch_size / micro_batches = {run.global_batch_size // run.micro_batches} "
                         f"must divide by the {split} ways the batch is split over mesh {dict(mesh.shape)}.")
    log.info("mesh: %s over %d devices", dict(mesh.shape), mesh.size)

    # ===== state =====
    abstract, shardings, init = abstract_state(model, tx, run.seed, run.max_seq_length, mesh, run.rules)
    fingerprint = checkpoint_lib.model_fingerprint(model)
    checkpoints = checkpoint_lib.Checkpointer(workdir, checkpoint_lib.CheckpointConfig.from_config(config.checkpoint),
                                              fingerprint)
    latest = checkpoints.latest_step()
    if latest is not None:  # refuse a foreign workdir before spending time on compilation
        checkpoints.check_compatible(latest)

    # ===== compile =====
    batch_abstract = batch_shapes(run.global_batch_size, run.max_seq_length, run.max_predictions_per_seq)
    batch_shardings = {k: sharding_lib.batch_sharding(mesh, run.rules, len(v.shape))
                       for k, v in batch_abstract.items()}
    compute_shardings = sharding_lib.gathered_for_compute(shardings.params)
    train_step = compile_step(make_train_step(model, tx, run.micro_batches, run.nsp, learning_rate,
                                              compute_shardings), abstract,
                              shardings, batch_abstract, batch_shardings, mesh, run.rules)
    if compile_only:
        checkpoints.close()
        writer.close()
        return {}
    eval_step = jax.jit(make_eval_step(model, run.nsp, compute_shardings),
                        in_shardings=(shardings.params, batch_shardings),
                        out_shardings=sharding_lib.replicated(mesh))

    # ===== restore =====
    if latest is not None:
        state = checkpoints.restore(latest, abstract, train_data)
        log.info("restore: resumed from %s/%d", checkpoints.directory, latest)
    else:
        state = init()
        if run.init_from:
            params = checkpoint_lib.place(load_init_from(run.init_from, model), shardings.params)
            state = state.replace(params=params,
                                  opt_state=jax.jit(tx.init, out_shardings=shardings.opt_state)(params))
            log.info("restore: weights from %s; fresh optimizer state", run.init_from)
    start_step = int(state.step)

    # ===== loop =====
    flops = metrics_lib.flops_per_sequence(model.config, run.max_seq_length, run.max_predictions_per_seq)
    peak = metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind, config.model.dtype)
    meter = metrics_lib.Throughput(run.num_train_steps)
    last_eval: dict[str, float] = {}

    def run_eval(step: int) -> dict:
        if eval_data is None:
            return {}
        with meter.paused():
            result = evaluate(eval_step, state.params, eval_data, eval_batches, mesh, run.rules)
        result.update(baselines)
        writer.write(step, result, kind="eval")
        log.info("eval  %s | baselines: mlm_acc %.2f%%, nsp_acc %.2f%%", metrics_lib.format_log_line(
            dict(result, step=step)), 100 * baselines.get("mlm_accuracy_baseline", float("nan")),
            100 * baselines.get("nsp_accuracy_baseline", float("nan")))
        return result

    running = None
    with _Stop() as stop:
        step = start_step
        while step < run.num_train_steps:
            local = next(train_data)
            state, step_metrics = train_step(state, sharding_lib.global_batch(local, mesh, run.rules))
            running = metrics_lib.merge(running, step_metrics)
            step += 1
            if step == start_step + 1:  # the clock starts after the first step: compilation and warm-up
                jax.block_until_ready(state.step)
                meter.update(step)
            if step % run.log_every_steps == 0 or step == run.num_train_steps:
                values = _host(running)
                timing = meter.update(step)
                if timing:
                    values.update(timing, **metrics_lib.throughput(
                        timing["step_time_s"], run.global_batch_size, run.max_seq_length, flops, peak,
                        jax.device_count()))
                writer.write(step, values, kind="train")
                log.info("train %s", metrics_lib.format_log_line(dict(values, step=step,
                                                                      num_train_steps=run.num_train_steps)))
                running = None
                if not np.isfinite(values.get("loss", 0.0)):
                    checkpoints.close()
                    raise FloatingPointError(
                        f"the training loss is {values['loss']} at step {step}; lower config.optim.learning_rate "
                        f"(now {optim.learning_rate}), raise config.optim.warmup_steps, or resume from the last "
                        f"checkpoint in {checkpoints.directory}.")
            if step % run.eval_every_steps == 0 and step < run.num_train_steps:
                last_eval = run_eval(step)
            with meter.paused():
                checkpoints.save(step, state, train_data)
            if stop.any_process():
                checkpoints.save(step, state, train_data, force=True)
                checkpoints.close()
                writer.close()
                log.info("stopped at step %d on request; rerun the same command to resume", step)
                return last_eval

    # ===== end =====
    last_eval = run_eval(step) or last_eval
    checkpoints.save(step, state, train_data, force=True)
    checkpoints.close()
    writer.close()
    if config.checkpoint.export_hf and primary:
        from bertjax import export as export_lib

        export_lib.export(workdir, os.path.join(workdir, "hf"))
    if config.eval.show_predictions and eval_data is not None and primary and config.data.vocab_file:
        show_predictions(model, state.params, eval_data, config, mesh)
    log.info("done: %d steps in %s", step, workdir)
    return last_eval
