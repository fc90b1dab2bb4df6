"""runtime/compile_cache.py: every command keeps its compiled programs in $BERTJAX_CACHE_DIR/jax_compilation_cache
unless the user chose a folder or turned caching off, and counts what it loads from there. (A job run twice
loading its step: test_demo's same-command test.)"""

import json
import os
import subprocess
import sys

import train_setup

SNIPPET = """
import json, os
import jax, jax.numpy as jnp
from bertjax.runtime import compile_cache

out = {}
os.environ["BERTJAX_COMPILATION_CACHE"] = "0"
out["switched_off"] = compile_cache.enable()
out["made_while_off"] = os.path.exists(compile_cache.default_dir())
del os.environ["BERTJAX_COMPILATION_CACHE"]
jax.config.update("jax_enable_compilation_cache", False)  # as JAX_ENABLE_COMPILATION_CACHE=false
out["jax_off"] = compile_cache.enable()
jax.config.update("jax_enable_compilation_cache", True)
jax.config.update("jax_compilation_cache_dir", "/the/users/own")  # as JAX_COMPILATION_CACHE_DIR
out["chosen"] = compile_cache.enable()
jax.config.update("jax_compilation_cache_dir", None)
out["default"] = compile_cache.enable()
out["max_size"] = jax.config.jax_compilation_cache_max_size
jax.jit(lambda x: jnp.sin(x) * 2 + 1).lower(jnp.ones(8)).compile()
out["hits_after_first"] = compile_cache.hits()
jax.jit(lambda x: jnp.sin(x) * 2 + 1).lower(jnp.ones(8)).compile()  # a new trace: the program from disk
out["hits_after_second"] = compile_cache.hits()
out["kept"] = sorted(n for n in os.listdir(out["default"]) if n.startswith("jit__lambda") and n.endswith("-cache"))
out["xla_caches"] = jax.config.jax_persistent_cache_enable_xla_caches
os.environ["XLA_FLAGS"] += " --xla_gpu_per_fusion_autotune_cache_dir=/the/users/autotune"  # as on a GPU machine
compile_cache.enable()
out["xla_caches_with_the_flag"] = jax.config.jax_persistent_cache_enable_xla_caches
print(json.dumps(out))
"""


def test_the_default_folder_unless_the_user_chose_or_turned_it_off(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "BERTJAX_COMPILATION_CACHE")}
    env.update(BERTJAX_CACHE_DIR=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "")
    done = subprocess.run(
        [sys.executable, "-c", SNIPPET], cwd=train_setup.ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["switched_off"] is None and not out["made_while_off"], out
    assert out["jax_off"] is None and out["chosen"] == "/the/users/own", out
    assert out["default"] == str(tmp_path / "jax_compilation_cache"), out
    assert out["max_size"] == 8 * 2**30, out  # bounded: the least recently used programs evicted
    assert (out["hits_after_first"], out["hits_after_second"]) == (0, 1), out
    assert len(out["kept"]) == 1, out
    # XLA:GPU's autotuning folder stays where XLA_FLAGS puts it (runtime/xla_flags.py's default or the user's), not
    # moved by jax into the compilation cache's.
    assert (out["xla_caches"], out["xla_caches_with_the_flag"]) == ("xla_gpu_per_fusion_autotune_cache_dir", "none")
