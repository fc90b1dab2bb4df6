"""The job re-executes itself under tcmalloc when the machine has it, once, and never when told not to."""

import os
import subprocess
import sys

from bertjax.runtime import tcmalloc

SHOW = "import os; from bertjax.runtime import tcmalloc; tcmalloc.reexec_under_tcmalloc(); print(os.environ.get('LD_PRELOAD', ''))"


def preload_seen(**env) -> str:
    env = {k: v for k, v in dict(os.environ, **env).items() if k != "LD_PRELOAD" or "LD_PRELOAD" in env}
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_reexec_preloads_tcmalloc_when_installed_and_not_when_disabled():
    path = tcmalloc.find()
    seen = preload_seen()
    if path is None:  # nothing to preload: the program runs on as it was
        assert seen == ""
    else:
        assert seen == path and os.path.isfile(seen)
    assert preload_seen(BERTJAX_NO_TCMALLOC="1") == ""
    # A preload the user set is kept (and tcmalloc goes first).
    kept = preload_seen(LD_PRELOAD="libdoesnotmatter.so")
    assert kept.endswith("libdoesnotmatter.so") and (path is None or kept.startswith(path + ":"))
