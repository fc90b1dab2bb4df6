"""Training and eval metrics: weighted (sum, count) pairs, loss, baselines, FLOPs / MFU, writers, log lines.

Metrics are computed on device as (weighted sum, weight) pairs, added across batches (and, being sums
over the global batch, across devices and processes for free), and divided only on the host. So eval
padding rows (example_weight 0) and padded prediction slots (masked_lm_weights 0) never skew a mean,
and merging batches gives exactly the metric of their concatenation.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.training import event_file
from bertjax import models as models_lib
from bertjax.runtime import files
from bertjax.runtime.files import is_remote

log = logging.getLogger(__name__)

Array = jax.Array
Metrics = dict[str, tuple[Any, Any]]  # name → (weighted sum, weight)

# google-research/bert's MLM denominator: sum(w * ce) / (sum(w) + 1e-5).
MLM_DENOMINATOR_EPS = 1e-5


# --- Loss and on-device metrics ----------------------------------------------------------------------


def _example_weight(example_weight: Optional[Array], batch: int) -> Array:
    if example_weight is None:
        return jnp.ones((batch,), jnp.float32)
    return jnp.asarray(example_weight, jnp.float32).reshape(batch)


def _argmax(logits: Array) -> Array:
    """`jnp.argmax` over the last axis (the first index of the maximum) as two plain reductions: XLA:CPU
    runs argmax's variadic (value, index) reduce unvectorised, a quarter of a BERT-tiny step over a
    30k vocabulary; max, then the smallest index holding it, cost a tenth of that."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1)


def _mlm_terms(mlm_logits, masked_lm_ids, masked_lm_weights, example_weight):
    """Per-prediction cross-entropy, correctness and weight, all float32 [batch, predictions], and the
    predicted ids, int32."""
    logits = jnp.asarray(mlm_logits, jnp.float32)
    ids = jnp.asarray(masked_lm_ids).astype(jnp.int32)
    ew = _example_weight(example_weight, ids.shape[0])
    w = jnp.asarray(masked_lm_weights, jnp.float32) * ew[:, None]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
    predicted = _argmax(logits)
    return ce, (predicted == ids).astype(jnp.float32), w, predicted


def _nsp_terms(nsp_logits, next_sentence_labels, example_weight, next_sentence_weights=None):
    """Per-instance cross-entropy, correctness and weight, float32 [batch] (or [batch, k] for packed rows,
    whose `next_sentence_weights` mark the instance slots in use)."""
    logits = jnp.asarray(nsp_logits, jnp.float32)
    labels = jnp.asarray(next_sentence_labels).reshape(logits.shape[:-1]).astype(jnp.int32)
    w = _example_weight(example_weight, logits.shape[0]).reshape((-1,) + (1,) * (logits.ndim - 2))
    if next_sentence_weights is not None:
        w = w * jnp.asarray(next_sentence_weights, jnp.float32)
    w = jnp.broadcast_to(w, labels.shape)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (_argmax(logits) == labels).astype(jnp.float32)
    return ce, correct, w


def _prediction_bits(predicted: Array, vocab_size: int, w: Array) -> Array:
    """Per bit of the predicted token id, the weight of the predictions with that bit set, float32 [bits].

    All predictions are one id exactly when every bit's sum is 0 or the total weight. Unlike a vocab-size
    histogram it costs a few reductions over the predictions, and being a sum it adds up over batches."""
    bits = max(1, (int(vocab_size) - 1).bit_length())
    shifted = predicted[..., None] >> jnp.arange(bits, dtype=jnp.int32)
    return jnp.sum((shifted & 1).astype(jnp.float32) * w[..., None], axis=tuple(range(w.ndim)))


def pretraining_metrics(
    mlm_logits: Array,
    masked_lm_ids: Array,
    masked_lm_weights: Array,
    nsp_logits: Optional[Array] = None,
    next_sentence_labels: Optional[Array] = None,
    example_weight: Optional[Array] = None,
    next_sentence_weights: Optional[Array] = None,
    constant_prediction: bool = False,
) -> Metrics:
    """{mlm_loss, mlm_accuracy[, mlm_constant_prediction][, nsp_loss, nsp_accuracy]} as (sum, count) float32.

    MLM terms are weighted by masked_lm_weights × example_weight, NSP terms by example_weight (times
    next_sentence_weights for packed rows: one NSP term per instance). With nsp_logits None (MLM-only
    data) the NSP keys are absent. mlm_constant_prediction (evals: `constant_prediction`; the train step
    stays as it was) has a vector sum (`_prediction_bits`), which `normalize` turns into the one token id
    every MLM prediction was (a collapsed model), else -1.
    """
    ce, correct, w, predicted = _mlm_terms(mlm_logits, masked_lm_ids, masked_lm_weights, example_weight)
    count = jnp.sum(w)
    out = {"mlm_loss": (jnp.sum(ce * w), count), "mlm_accuracy": (jnp.sum(correct * w), count)}
    if constant_prediction:  # an eval: also the squares, for the loss's standard error
        out["mlm_constant_prediction"] = (_prediction_bits(predicted, mlm_logits.shape[-1], w), count)
        out["mlm_loss_squares"] = (jnp.sum(ce * ce * w), count)
    if nsp_logits is not None:
        ce, correct, w = _nsp_terms(nsp_logits, next_sentence_labels, example_weight, next_sentence_weights)
        count = jnp.sum(w)
        out["nsp_loss"] = (jnp.sum(ce * w), count)
        out["nsp_accuracy"] = (jnp.sum(correct * w), count)
    return out


def loss(
    mlm_logits: Array,
    masked_lm_ids: Array,
    masked_lm_weights: Array,
    nsp_logits: Optional[Array] = None,
    next_sentence_labels: Optional[Array] = None,
    example_weight: Optional[Array] = None,
) -> Array:
    """The scalar training loss, float32, as google-research/bert:
    sum(w·ce_mlm) / (sum(w) + 1e-5)  +  mean NSP cross-entropy (weighted by example_weight)."""
    return loss_and_metrics(
        mlm_logits, masked_lm_ids, masked_lm_weights, nsp_logits, next_sentence_labels, example_weight
    )[0]


def loss_and_metrics(
    mlm_logits: Array,
    masked_lm_ids: Array,
    masked_lm_weights: Array,
    nsp_logits: Optional[Array] = None,
    next_sentence_labels: Optional[Array] = None,
    example_weight: Optional[Array] = None,
) -> tuple[Array, Metrics]:
    """`loss(...)` and `pretraining_metrics(...)` from one log-softmax (for value_and_grad(has_aux=True))."""
    metrics = pretraining_metrics(
        mlm_logits, masked_lm_ids, masked_lm_weights, nsp_logits, next_sentence_labels, example_weight
    )
    return pretraining_loss(metrics), metrics


def pretraining_loss(sums: Metrics, mlm_count: Optional[Array] = None, nsp_count: Optional[Array] = None) -> Array:
    """The training loss from `pretraining_metrics` sums: google-research/bert's
    sum(w·ce_mlm) / (sum(w) + 1e-5) + the NSP cross-entropy's mean over weighted examples.

    The counts default to the sums' own. The train step passes the whole batch's counts while `sums`
    covers one micro-batch, so that the micro-batch losses add up to the whole batch's loss."""
    total, count = sums["mlm_loss"]
    value = total / ((count if mlm_count is None else mlm_count) + MLM_DENOMINATOR_EPS)
    if "nsp_loss" in sums:
        total, count = sums["nsp_loss"]
        # Plain mean when every example counts (sum(ew) = batch); padding rows drop out otherwise.
        value = value + total / jnp.maximum(count if nsp_count is None else nsp_count, MLM_DENOMINATOR_EPS)
    return value


def merge(a: Optional[Metrics], b: Metrics) -> Metrics:
    """Adds two metric dicts key by key (works on device arrays or numpy); `a` may be None or empty."""
    if not a:
        return dict(b)
    if set(a) != set(b):
        raise ValueError(f"cannot merge metrics with different keys: {sorted(a)} vs {sorted(b)}")
    return {k: (a[k][0] + b[k][0], a[k][1] + b[k][1]) for k in a}


def to_carry(metrics: Optional[Metrics]) -> Optional[dict]:
    """(sum, count) pairs as JSON, dtypes kept: a checkpoint carries them to a resumed run's next log line."""
    if metrics is None:
        return None
    host = jax.device_get(metrics)
    return {k: [[np.asarray(v).tolist(), str(np.asarray(v).dtype)] for v in pair] for k, pair in host.items()}


def from_carry(carried: Optional[dict]) -> Optional[Metrics]:
    """to_carry's pairs back as numpy values of their dtypes (so a resumed sum adds bit for bit as the original)."""
    if not carried:
        return None
    return {k: tuple(np.asarray(value, dtype) for value, dtype in pair) for k, pair in carried.items()}


def normalize(metrics: Metrics) -> dict[str, float]:
    """(sum, count) → sum / count as Python floats on the host (NaN where nothing was counted); a vector
    sum (mlm_constant_prediction's bits) → the one id all predictions were, or -1 if they were not one."""
    host = jax.device_get(metrics)
    return {
        k: float("nan")
        if not float(c) > 0
        else float(s) / float(c)
        if np.ndim(s) == 0
        else _constant_id(np.asarray(s, np.float64), float(c))
        for k, (s, c) in host.items()
    }


def eval_result(total: Metrics) -> dict[str, float]:
    """A pre-training eval's (sum, count) totals → its metrics, with `mlm_targets` (the weighted masked targets)
    and the standard errors of MLM accuracy, sqrt(p(1-p)/n), and loss, sqrt(var/n), over the targets."""
    result = normalize(total)
    n = float(jax.device_get(total["mlm_accuracy"][1]))
    result["mlm_targets"] = n
    p, mean, squares = result["mlm_accuracy"], result["mlm_loss"], result.pop("mlm_loss_squares", math.nan)
    result["mlm_accuracy_stderr"] = math.sqrt(p * (1 - p) / n) if n > 0 else math.nan
    result["mlm_loss_stderr"] = math.sqrt(max(squares - mean * mean, 0.0) / n) if n > 0 else math.nan
    return result


def _constant_id(bit_sums: np.ndarray, count: float) -> float:
    # A bit is fixed when set in all predictions or in none (float32 sums: exact below 2^24, else within 1e-6).
    slack = 1e-6 * count
    ones, zeros = bit_sums >= count - slack, bit_sums <= slack
    if not np.all(ones | zeros):
        return -1.0
    return float(sum(1 << b for b in np.flatnonzero(ones)))


# --- Baselines (numpy, on the host) ------------------------------------------------------------------


def baselines(batches: Iterable[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Accuracy a constant predictor gets on these eval batches, weighted like the metrics.

    mlm_accuracy_baseline: the fraction of masked targets equal to the most frequent target id;
    nsp_accuracy_baseline: the majority-class rate max(p, 1 - p) of next_sentence_labels (absent when
    the batches have no labels). Rows with example_weight 0 (eval padding) do not count.
    """
    token_counts = np.zeros(0, np.float64)
    nsp_total = nsp_zero = 0.0
    has_nsp = False
    for batch in batches:
        ids = np.asarray(batch["masked_lm_ids"]).astype(np.int64)
        ew = (
            np.ones(ids.shape[0])
            if batch.get("example_weight") is None
            else np.asarray(batch["example_weight"], np.float64).reshape(ids.shape[0])
        )
        w = np.asarray(batch["masked_lm_weights"], np.float64) * ew[:, None]
        counts = np.bincount(ids.ravel(), weights=w.ravel())
        if counts.size > token_counts.size:
            counts[: token_counts.size] += token_counts
            token_counts = counts
        else:
            token_counts[: counts.size] += counts
        if batch.get("next_sentence_labels") is not None:
            has_nsp = True
            labels = np.asarray(batch["next_sentence_labels"]).reshape(ids.shape[0], -1)
            nsp_w = ew[:, None] * np.asarray(batch.get("next_sentence_weights", np.ones(labels.shape)), np.float64)
            nsp_total += float(nsp_w.sum())
            nsp_zero += float(nsp_w[labels == 0].sum())
    total = float(token_counts.sum())
    out = {"mlm_accuracy_baseline": float(token_counts.max()) / total if total > 0 else float("nan")}
    if has_nsp:
        p = nsp_zero / nsp_total if nsp_total > 0 else float("nan")
        out["nsp_accuracy_baseline"] = max(p, 1.0 - p)
    return out


def not_learning(result: Mapping[str, float], step: int, num_train_steps: int, after: float) -> Optional[str]:
    """Why held-out results say a pre-training run is not learning, as a clause, or None.

    Judged only from `after` × num_train_steps on (0: never): every MLM prediction is one token id
    (mlm_constant_prediction ≥ 0), or MLM accuracy has not risen above its unigram baseline p by more than
    its standard error sqrt(p(1-p)/n), n = mlm_targets (the weighted masked targets evaluated). An NSP
    accuracy at or below its majority class is added to the clause, not judged alone.
    """
    if not after or step < after * num_train_steps:
        return None
    accuracy, baseline = result.get("mlm_accuracy", math.nan), result.get("mlm_accuracy_baseline", math.nan)
    constant, n = result.get("mlm_constant_prediction", -1.0), result.get("mlm_targets", 0.0)
    if constant is not None and constant >= 0:
        why = f"every held-out MLM prediction is the same token (id {int(constant)})"
    elif (
        n > 0
        and math.isfinite(accuracy)
        and math.isfinite(baseline)
        and accuracy <= baseline + math.sqrt(baseline * (1 - baseline) / n)
    ):
        why = (
            f"held-out MLM accuracy {accuracy:.2%} has not left its unigram baseline {baseline:.2%} (standard "
            f"error {math.sqrt(baseline * (1 - baseline) / n):.2%} over {int(n):,} masked targets)"
        )
    else:
        return None
    nsp, nsp_baseline = result.get("nsp_accuracy", math.nan), result.get("nsp_accuracy_baseline", math.nan)
    if nsp <= nsp_baseline:
        why += f" and NSP accuracy {nsp:.2%} is not above its majority class {nsp_baseline:.2%}"
    return why


# --- FLOPs, throughput, MFU --------------------------------------------------------------------------


def flops_per_sequence(
    architecture: Any, seq_len: int, num_predictions: Optional[int] = None, training: bool = True
) -> float:
    """Model FLOPs of one sequence by the family's own formula (models/<family>.py `flops_per_sequence`)."""
    return models_lib.of(architecture).model.flops_per_sequence(architecture, seq_len, num_predictions, training)


# Dense (no sparsity) peak matmul FLOP/s per JAX device. Keys are lower-case substrings of
# `jax.Device.device_kind`, most specific first. "float32" means what XLA runs an f32 matmul as at
# default precision: one bf16 pass on TPU (so the bf16 peak) and TF32 on Ampere/Hopper GPUs.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("tpu v6 lite", {"bfloat16": 918e12, "float32": 918e12}),  # v6e (Trillium), per chip
    ("tpu v5 lite", {"bfloat16": 197e12, "float32": 197e12}),  # v5e, per chip
    ("tpu v5p", {"bfloat16": 459e12, "float32": 459e12}),
    ("tpu v5", {"bfloat16": 459e12, "float32": 459e12}),  # v5p reports "TPU v5"
    ("tpu v4", {"bfloat16": 275e12, "float32": 275e12}),  # per chip (megacore = one device)
    ("h100 pcie", {"bfloat16": 756e12, "float32": 378e12}),
    ("h100", {"bfloat16": 989e12, "float32": 494.5e12}),  # SXM; float32 = TF32 dense
    ("h200", {"bfloat16": 989e12, "float32": 494.5e12}),
    ("a100", {"bfloat16": 312e12, "float32": 156e12}),  # float32 = TF32 dense
)


def peak_flops_per_device(device_kind: str, dtype: str = "bfloat16") -> Optional[float]:
    """Peak FLOP/s of one device from PEAK_FLOPS, or None when unknown (then MFU is not reported)."""
    kind = device_kind.lower()
    for key, table in PEAK_FLOPS:
        if key in kind:
            return table.get(str(dtype))
    return None


def throughput(
    step_time_s: float,
    global_batch_size: int,
    seq_len: int,
    flops_per_seq: Optional[float] = None,
    peak_flops: Optional[float] = None,
    num_devices: int = 1,
    instances_per_row: float = 1.0,
    real_tokens_per_row: Optional[float] = None,
) -> dict[str, float]:
    """seq_per_s (instances: several a row when packed), tokens_per_s (positions computed), and with
    `real_tokens_per_row` real_tokens_per_s and padding_fraction; mfu (0-1) when flops_per_seq (per row)
    and a peak (per device) are known."""
    rows_per_s = global_batch_size / step_time_s
    out = {"seq_per_s": rows_per_s * instances_per_row, "tokens_per_s": rows_per_s * seq_len}
    if real_tokens_per_row is not None:
        out.update(
            real_tokens_per_s=rows_per_s * real_tokens_per_row, padding_fraction=1.0 - real_tokens_per_row / seq_len
        )
    if flops_per_seq and peak_flops:
        out["mfu"] = flops_per_seq * rows_per_s / (peak_flops * num_devices)
    return out


class Throughput:
    """Wall time per step between log points, and ETA.

    Call `update(step)` once after the first (compiling) step has finished — that call only starts
    the clock — then at every log point, after the step's metrics reached the host (so the device is
    done). Time spent inside `with tracker.paused():` (eval, checkpointing) is not in the step time; the
    ETA spreads all the time since the clock started, pauses included, over the steps left: steadier than
    the last interval alone, and it counts the evals and saves still to come.
    """

    def __init__(self, num_train_steps: int, clock=time.perf_counter):
        self.num_train_steps = int(num_train_steps)
        self._clock = clock
        self._start: Optional[tuple[int, float]] = None
        self._last: Optional[tuple[int, float]] = None
        self._excluded = 0.0
        self._input_wait = 0.0

    def input_wait(self, seconds: float) -> None:
        """Time the loop spent waiting for its next batch (the input pipeline not ready)."""
        self._input_wait += seconds

    def update(self, step: int) -> dict[str, float]:
        """{step_time_s, steps_per_s, eta_s, input_wait_fraction} since the previous update; {} on the first call.
        input_wait_fraction: the share of the (unpaused) interval the device waited for batches (loop.next_batch)."""
        now = self._clock()
        out = {}
        if self._last is not None and step > self._last[0]:
            elapsed = max(now - self._last[1] - self._excluded, 1e-9)
            step_time = elapsed / (step - self._last[0])
            wall_per_step = (now - self._start[1]) / (step - self._start[0])
            out = {
                "step_time_s": step_time,
                "steps_per_s": 1.0 / step_time,
                "eta_s": max(self.num_train_steps - step, 0) * wall_per_step,
                "input_wait_fraction": min(self._input_wait / elapsed, 1.0),
            }
        if self._start is None:
            self._start = (int(step), now)
        self._last, self._excluded, self._input_wait = (int(step), now), 0.0, 0.0
        return out

    def paused(self):
        tracker = self

        class _Paused:
            def __enter__(self):
                self.start = tracker._clock()

            def __exit__(self, *exc):
                tracker._excluded += tracker._clock() - self.start
                return False

        return _Paused()


# --- Log line ----------------------------------------------------------------------------------------


def format_eta(seconds: float) -> str:
    """h:mm:ss (hours unbounded)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


INPUT_BOUND = 0.05  # a log line says so when the loop waited this share of its time for batches


def format_log_line(m: Mapping[str, Any], extra: Sequence[str] = ()) -> str:
    """One log line from a dict of host floats; keys that are absent are left out.

    Keys: step, num_train_steps, loss, mlm_accuracy, nsp_accuracy, learning_rate, grad_norm, seq_per_s,
    tokens_per_s, real_tokens_per_s, padding_fraction (0-1), mfu (0-1), eta_s, skipped_steps (shown when > 0),
    input_wait_fraction (shown from INPUT_BOUND on),
    then each of `extra` present in m, as `key value` (fine-tuning's held-out scores).
    """
    parts = []
    if "step" in m:
        total = f"/{int(m['num_train_steps'])}" if "num_train_steps" in m else ""
        parts.append(f"step {int(m['step'])}{total}")
    fields = (
        ("loss", "loss {:.4f}", 1),
        ("mlm_accuracy", "mlm_acc {:.2f}%", 100),
        ("nsp_accuracy", "nsp_acc {:.2f}%", 100),
        ("learning_rate", "lr {:.3e}", 1),
        ("grad_norm", "grad_norm {:.3f}", 1),
        ("seq_per_s", "{:,.1f} seq/s", 1),
        ("tokens_per_s", "{:,.0f} tok/s", 1),
        ("real_tokens_per_s", "{:,.0f} real tok/s", 1),
        ("padding_fraction", "padding {:.1f}%", 100),
        ("mfu", "MFU {:.1f}%", 100),
    )
    for key, fmt, scale in fields:
        if m.get(key) is not None:
            parts.append(fmt.format(float(m[key]) * scale))
    if m.get("eta_s") is not None:
        parts.append(f"ETA {format_eta(float(m['eta_s']))}")
    if m.get("skipped_steps"):
        parts.append(f"{int(m['skipped_steps'])} non-finite step(s) skipped")
    if m.get("input_wait_fraction", 0.0) >= INPUT_BOUND:
        parts.append(f"input-bound: {100 * float(m['input_wait_fraction']):.0f}% of the time waiting for batches")
    parts.extend(f"{key} {float(m[key]):.4g}" for key in extra if m.get(key) is not None)
    return " | ".join(parts)


def format_mix(m: Mapping[str, float]) -> str:
    """A mixture's log line: each source's share of the interval's rows and its epochs so far."""
    names = [k[len("mix_") :] for k in m if k.startswith("mix_")]
    return " | ".join(f"{n} {100 * m[f'mix_{n}']:.1f}% (epoch {m.get(f'epochs_{n}', 0.0):.2f})" for n in names)


# --- Writers -----------------------------------------------------------------------------------------


class _AppendOnlyFile:
    """A text file lines are appended to and flushed: appended locally, rewritten whole on object stores."""

    def __init__(self, path: str, rewrite: Optional[bool] = None, uploads: Optional[files.BackgroundWrites] = None):
        self.path = path
        self._uploads = uploads
        files.makedirs(os.path.dirname(path))
        if is_remote(path) if rewrite is None else rewrite:  # an object store (gs://): no appends
            self._local, self._text = None, ""
            if files.exists(path):
                with files.open_file(path) as f:
                    self._text = f.read()
        else:
            self._local = open(path, "a", encoding="utf-8")

    def write(self, text: str) -> None:
        if self._local is not None:
            self._local.write(text)
        else:
            self._text += text

    def flush(self) -> None:
        if self._local is not None:
            self._local.flush()
        elif self._uploads is not None:
            self._uploads.put(self.path, self._text)
        else:
            files.write_whole(self.path, self._text)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()


class MetricWriter:
    """TensorBoard events (tag `kind/key`) and `metrics.jsonl` in workdir, written by process 0 only.

    metrics.jsonl holds one object per write, {"step": N, "kind": "train"|"eval"|..., key: float, ...},
    non-finite values as null; it is opened in append mode, so a resumed run continues the file (steps
    between its last checkpoint and the interruption then appear twice: the later line wins). Every
    write is flushed. On other processes every method is a no-op. In a workdir on an object store
    (gs://, which a multi-host TPU slice needs), which cannot append, each write replaces the object
    with its whole new content (a few MB over a long run), uploaded by a background thread: the step
    never waits on the bucket (close() waits for the last upload).
    """

    def __init__(self, workdir: str, is_primary: bool, tensorboard: bool = True, filename: str = "metrics.jsonl"):
        self.is_primary = bool(is_primary)
        self._jsonl = None
        self._tb = None
        self._uploads = None
        if not self.is_primary:
            return
        self.jsonl_path = os.path.join(workdir, filename)
        self._uploads = files.BackgroundWrites() if is_remote(workdir) else None
        self._jsonl = _AppendOnlyFile(self.jsonl_path, uploads=self._uploads)
        if tensorboard:  # what tf.summary.scalar writes, without importing TensorFlow (event_file.py)
            self._tb = event_file.EventFileWriter(workdir, uploads=self._uploads)

    def write(
        self, step: int, metrics: Mapping[str, Any], kind: str = "train", notes: Optional[Mapping[str, str]] = None
    ) -> None:
        """`notes` (key → text, e.g. a warning) go into metrics.jsonl only: TensorBoard takes numbers."""
        if not self.is_primary:
            return
        values = {}
        for key, value in metrics.items():
            try:
                values[key] = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"metric {key!r}={value!r} is not a number.") from None
        record = {"step": int(step), "kind": kind}
        record.update({k: v if math.isfinite(v) else None for k, v in values.items()})
        record.update(notes or {})
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.scalars(int(step), {f"{kind}/{key}": value for key, value in values.items()})
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            tb, self._tb = self._tb, None
            try:
                tb.close()
            except OSError as e:  # the job is stopping for the full disk already: that is its one sentence
                if e.errno != errno.ENOSPC:
                    raise
                log.warning(
                    "metrics: the TensorBoard file %s lost its last rows: no space left on device "
                    "(metrics.jsonl has them)",
                    tb.path,
                )
        if self._uploads is not None:  # a bucket: the last rewrites uploaded before the job goes on or ends
            uploads, self._uploads = self._uploads, None
            uploads.close()

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
