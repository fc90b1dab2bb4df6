"""benchmarks/recipes.py (time to quality, 2018's recipe vs the modern one): the curve it reads from a job's
metrics.jsonl, the time to a target, the modern run's step budget with its batch warmup; and
configs/modernbert_demo.py, the modern recipe at the demo's size."""

import json
import pathlib
import runpy
import sys
import types

import jax
import pytest

import train_setup
from bertjax.training import batch_warmup
from bertjax.jobs import main as train_lib
from bertjax.training import metrics as metrics_lib
from bertjax import models as models_lib
from bertjax.config.schema import JobConfig
from bertjax.models import layers

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recipes  # noqa: E402


def write_run(workdir, step_times: dict[int, float], evals: dict[int, float]) -> None:
    """A job's metrics.jsonl as the loop writes it: train rows at log points, eval rows after them."""
    with metrics_lib.MetricWriter(str(workdir), is_primary=True) as writer:
        for step in sorted(set(step_times) | set(evals)):
            if step in step_times:
                writer.write(step, {"loss": 1.0, "step_time_s": step_times[step]}, kind="train")
            if step in evals:
                writer.write(step, {"mlm_accuracy": evals[step], "mlm_loss": 5.0}, kind="eval")


def test_the_curve_counts_training_seconds_between_log_points(tmp_path):
    # Steps 0–100 at 0.2 s, 100–200 at 0.1 s (the batch grew, or the machine got quieter), 200–300 at 0.3 s.
    write_run(tmp_path, {100: 0.2, 200: 0.1, 300: 0.3}, {100: 0.05, 200: 0.09, 300: 0.12})
    rows = recipes.read_metrics(str(tmp_path))
    assert recipes.training_seconds(rows) == pytest.approx({100: 20.0, 200: 30.0, 300: 60.0})
    points = recipes.curve(rows)
    assert points == [(20.0, 0.05), (30.0, 0.09), (60.0, 0.12)]
    assert recipes.seconds_to_reach(points, 0.09) == 30.0  # the first eval at or above it
    assert recipes.seconds_to_reach(points, 0.10) == 60.0
    assert recipes.seconds_to_reach(points, 0.13) is None  # never reached: the JSON's null
    assert (recipes.accuracy_at(points, 59.9), recipes.accuracy_at(points, 60.0), recipes.accuracy_at(points, 5)) == (
        0.09,
        0.12,
        None,
    )


def test_a_real_jobs_curve_and_a_recount_of_its_final_eval(tmp_path, pydocs_data):
    # A tiny job that evaluates on the whole held-out set every 2 steps: the curve has a point per eval, and
    # mlm_accuracy (the benchmark's count of another recipe's rows) gives exactly the job's own final figure.
    c = train_setup.small_config(
        pydocs_data,
        **{"train.num_train_steps": 6, "train.log_every_steps": 2, "eval.every_steps": 2, "eval.num_batches": 0},
    )
    train_lib.train_and_evaluate(c, str(tmp_path))
    rows = recipes.read_metrics(str(tmp_path))
    points = recipes.curve(rows)
    assert len(points) == 3 and all(a < b for (a, _), (b, _) in zip(points, points[1:]))
    final = [r for r in rows if r["kind"] == "eval"][-1]["mlm_accuracy"]
    assert points[-1][1] == final
    recount = recipes.mlm_accuracy(
        str(tmp_path), str(pathlib.Path(pydocs_data) / "heldout" / "*.tfrecord"), train_setup.SEQ, train_setup.PRED
    )
    assert recount == pytest.approx(final, abs=1e-6)


def test_the_modern_step_budget_fills_the_time_its_batch_warmup_included():
    train = {"global_batch_size": 32, "micro_batches": 4, "batch_warmup_start": 8, "batch_warmup_tokens": 0}
    plain = recipes.steps_for(100.0, 0.25, dict(train, micro_batches=1), 64, 0.1)
    assert plain == 400  # no warmup: seconds / step time
    steps = recipes.steps_for(100.0, 0.25, train, 64, 0.1)
    assert steps > plain  # the warmup's steps of fewer micro-batches cost less
    tokens = int(0.1 * steps * 32 * 64)
    warm = batch_warmup.BatchWarmup(types.SimpleNamespace(**dict(train, batch_warmup_tokens=tokens)), 64)
    modelled = sum(0.25 * warm.micro_batches_at(s) / 4 for s in range(steps))
    assert modelled == pytest.approx(100.0, abs=0.25)  # within a step of the budget


def _params(config) -> int:
    job = JobConfig.from_configdict(config)
    family = models_lib.get(job.model.family)
    model = family.model.from_config(job.model)
    shapes = jax.eval_shape(lambda rng: family.model.init_params(model, rng), jax.random.PRNGKey(0))
    return layers.param_count(shapes)


def test_the_modern_demo_config_is_the_modern_recipe_at_the_demos_size():
    modern = runpy.run_path(str(ROOT / "configs" / "modernbert_demo.py"))["get_config"]()
    demo = runpy.run_path(str(ROOT / "configs" / "demo.py"))["get_config"]()
    for c in (modern, demo):
        c.model.vocab_size = 4096  # the demo's corpus vocab
    assert abs(_params(modern) / _params(demo) - 1) < 0.02, (_params(modern), _params(demo))
    job = JobConfig.from_configdict(modern)
    assert job.model.family == "modernbert" and not job.data.next_sentence_prediction
    assert (job.data.masked_lm_prob, job.data.eval_masked_lm_prob, job.data.dynamic_masking, job.data.packing) == (
        0.3,
        0.15,
        True,
        True,
    )
    arch = job.model.architecture  # transformers' ModernBertConfig names
    assert arch.embedding_dropout == arch.attention_dropout == arch.mlp_dropout == 0
    assert (job.optim.schedule, job.optim.decay_shape, job.optim.decay_steps) == ("wsd", "1-sqrt", 400)
    assert 0 < job.train.batch_warmup_start < job.train.global_batch_size and job.train.batch_warmup_tokens > 0
    # The same corpus, split, vocab size, sequence, batch and peak rate as the demo: what the benchmark compares.
    for key in ("corpus", "corpus_vocab_size", "heldout_every", "max_seq_length"):
        assert modern.data[key] == demo.data[key], key
    assert (modern.train.global_batch_size, modern.optim.learning_rate) == (
        demo.train.global_batch_size,
        demo.optim.learning_rate,
    )
    quick = runpy.run_path(str(ROOT / "configs" / "modernbert_demo.py"))["get_config"]("quick")
    assert quick.train.num_train_steps * 10 == modern.train.num_train_steps


def test_unknown_ablations_are_refused(capsys):
    with pytest.raises(SystemExit):
        recipes.parse_args(["--ablations=mask_15,no_such_thing"])
    assert "no_such_thing" in capsys.readouterr().err
    assert json.dumps(recipes.parse_args(["--ablations=all"]).ablations) == '"all"'
