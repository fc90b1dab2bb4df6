"""The XLA flags bertjax adds on GPU machines: only there, each once, never over the user's own."""

from bertjax.runtime import xla_flags
from bertjax.runtime import gpu_targets


def test_on_a_gpu_machine_the_autotune_cache_is_kept_across_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: True)
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
    environ = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
    added = xla_flags.apply_gpu_defaults(environ)
    cache = tmp_path / "xla_gpu_autotune"
    assert added == [f"--xla_gpu_per_fusion_autotune_cache_dir={cache}", "--xla_gpu_enable_cudnn_layer_norm=true"]
    assert cache.is_dir()
    assert environ["XLA_FLAGS"] == " ".join(["--xla_gpu_enable_latency_hiding_scheduler=true", *added])
    assert xla_flags.apply_gpu_defaults(environ) == []  # once: a second call (a child process) adds nothing


def test_the_users_own_value_wins_and_a_cpu_machine_gets_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: True)
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
    mine_value = "--xla_gpu_per_fusion_autotune_cache_dir=/mine --xla_gpu_enable_cudnn_layer_norm=false"
    mine = {"XLA_FLAGS": mine_value}
    assert xla_flags.apply_gpu_defaults(mine) == [] and mine["XLA_FLAGS"] == mine_value
    assert not (tmp_path / "xla_gpu_autotune").exists()
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: False)
    empty: dict = {}
    assert xla_flags.apply_gpu_defaults(empty) == [] and empty == {}
    # A program compiled here for a GPU that is not here (train_step.py --compile_for) gets them too.
    compiled_for_gpu: dict = {}
    assert xla_flags.apply_gpu_defaults(compiled_for_gpu, for_gpu=True)
    assert "--xla_gpu_enable_cudnn_layer_norm=true" in compiled_for_gpu["XLA_FLAGS"]
