"""The XLA flags bertjax adds on GPU machines: only there, each once, never over the user's own."""

from bertjax.runtime import xla_flags
from bertjax.training import gpu_targets


def test_on_a_gpu_machine_the_autotune_cache_is_kept_across_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: True)
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
    environ = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
    added = xla_flags.apply_gpu_defaults(environ)
    cache = tmp_path / "xla_gpu_autotune"
    assert added == [f"--xla_gpu_per_fusion_autotune_cache_dir={cache}"] and cache.is_dir()
    assert environ["XLA_FLAGS"] == f"--xla_gpu_enable_latency_hiding_scheduler=true {added[0]}"
    assert xla_flags.apply_gpu_defaults(environ) == []  # once: a second call (a child process) adds nothing


def test_the_users_own_value_wins_and_a_cpu_machine_gets_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: True)
    monkeypatch.setenv("BERTJAX_CACHE_DIR", str(tmp_path))
    mine = {"XLA_FLAGS": "--xla_gpu_per_fusion_autotune_cache_dir=/mine"}
    assert (
        xla_flags.apply_gpu_defaults(mine) == []
        and mine["XLA_FLAGS"] == "--xla_gpu_per_fusion_autotune_cache_dir=/mine"
    )
    assert not (tmp_path / "xla_gpu_autotune").exists()
    monkeypatch.setattr(gpu_targets, "gpu_here", lambda: False)
    empty: dict = {}
    assert xla_flags.apply_gpu_defaults(empty) == [] and empty == {}
