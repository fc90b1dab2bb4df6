"""A bucket that stops answering: which failures pass (a refused or dropped connection, a timeout, 5xx, 429), how
long they are retried, how the retries are shown (a count, never a traceback), and the one sentence that ends a
run they outlast (`Resumable.resuming_from`: the committed step the same command resumes from).

Each client retries on its own: gcsfs six times (about 30 s of backoff; not adjustable), tensorstore (orbax's
arrays) as many times as fit in the retry budget, the stream window (stream_window.py) until the budget is spent.
The budget is `BERTJAX_BUCKET_RETRY_SECONDS` (default 900: a 15-minute outage of a read is ridden out). When a
client gives up, the job stops: its error is turned into one sentence here, whichever thread raised it, and
the clients' own reports of it (gcsfs's and orbax's logged tracebacks, a dozen per minute of outage) are counted
instead of printed.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import urllib.parse
from typing import Optional

log = logging.getLogger(__name__)

RETRY_SECONDS_ENV = "BERTJAX_BUCKET_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 900.0
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
GCS_ENDPOINT = "https://storage.googleapis.com"
# tensorstore's backoff between tries (its gcs_request_retries defaults: 1 s, doubling, at most 32 s)
FIRST_DELAY_S, MAX_DELAY_S = 1.0, 32.0
# What tensorstore and the HTTP clients write for a failure that may pass (their errors carry no type for it).
TRANSIENT_WORDS = (
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "retry attempts failed",  # tensorstore, past its gcs_request_retries
    "CURL error",
    "Cannot connect to host",
    "Connection reset",
    "Server disconnected",
)
TRANSIENT_CODES = frozenset((408, 429, 500, 502, 503, 504))
LOG_EVERY_S = 30.0  # a retry count at most this often


def retry_seconds() -> float:
    """How long a failing bucket is retried before the run stops: $BERTJAX_BUCKET_RETRY_SECONDS, else 15 minutes."""
    text = os.environ.get(RETRY_SECONDS_ENV, "").strip()
    if not text:
        return DEFAULT_RETRY_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(
            f"{RETRY_SECONDS_ENV}={text!r} is not a number of seconds; set it to how long a failing bucket is "
            f"retried (default {DEFAULT_RETRY_SECONDS:g}), or unset it."
        ) from None
    return max(0.0, seconds)


def duration(seconds: float) -> str:
    """A retry budget in words: "15 minutes", "20 seconds"."""
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} seconds"


def tensorstore_retries(budget: float) -> int:
    """How many tries of tensorstore's backoff fit in `budget` seconds (32 in 15 minutes, its own default)."""
    tries, spent, delay = 0, 0.0, FIRST_DELAY_S
    while spent < budget:
        tries, spent, delay = tries + 1, spent + delay, min(2 * delay, MAX_DELAY_S)
    return max(1, tries)


# --- Which failures pass ---------------------------------------------------------------------------------


def _chain(error: BaseException) -> list[BaseException]:
    """The error and those it was raised from or while handling (a thread's error re-raised by orbax)."""
    seen: list[BaseException] = []
    while error is not None and all(error is not e for e in seen):
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _one_transient(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, TimeoutError, socket.gaierror)):
        return True
    for module, names in (
        ("aiohttp", ("ClientConnectionError", "ClientPayloadError", "ServerTimeoutError")),
        ("requests.exceptions", ("ConnectionError", "Timeout", "ProxyError", "ChunkedEncodingError")),
    ):
        kinds = tuple(k for k in (getattr(sys.modules.get(module), n, None) for n in names) if k is not None)
        if kinds and isinstance(error, kinds):
            return True
    code = getattr(error, "code", None)  # gcsfs's HttpError carries the status
    if type(error).__name__ == "HttpError" and code in TRANSIENT_CODES:
        return True
    text = str(error)
    return any(word in text for word in TRANSIENT_WORDS)


def transient(error: BaseException) -> bool:
    """Whether a failed request (or an error it caused) may succeed later: a connection refused, reset or dropped,
    a timeout, an HTTP 5xx, 408 or 429. A missing object, a refusal (403) or a full disk is not."""
    return any(_one_transient(e) for e in _chain(error))


def _summary(error: BaseException) -> str:
    found = next((e for e in _chain(error) if _one_transient(e)), error)
    text = (str(found).strip().splitlines() or [""])[0][:160]
    return f"{type(found).__name__}: {text}" if text else type(found).__name__


def endpoint() -> str:
    """The storage endpoint the clients talk to: the emulator's when $STORAGE_EMULATOR_HOST names one."""
    return os.environ.get(EMULATOR_ENV, "").strip() or GCS_ENDPOINT


# --- The one sentence ----------------------------------------------------------------------------------------


class Resumable(ValueError):
    """The run stopped for something outside it (the bucket failed, or its record set changed): the sentence ends
    naming where the same command resumes (RESUME until the step is known: `resuming_from`)."""

    RESUME = "the last checkpoint"

    def resuming_from(self, step: Optional[int]) -> "Resumable":
        """The same sentence naming the step the rerun resumes from (once: a named step stays)."""
        where = f"step {step}, the newest checkpoint" if step else "the start (no step was saved yet)"
        return type(self)(str(self).replace(self.RESUME, where, 1))


class BucketUnavailable(Resumable):
    """The bucket failed for longer than its clients retry."""


class Unreachable(ConnectionError):
    """The storage endpoint cannot be reached at all, found before any work: its sentence is the one to show."""


def stopped_by(error: BaseException, where: str = "") -> Optional[Resumable]:
    """The one sentence for a run that `error` stopped, if the bucket is why (a Resumable in its chain, or a
    transient failure the clients gave up on); None for anything else. `where`: the workdir or path involved."""
    for e in _chain(error):
        if isinstance(e, Resumable):
            return e
    if isinstance(error, Unreachable) or not transient(error):
        return None
    parts = urllib.parse.urlsplit(where)
    bucket = f" {parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""  # a workdir in a bucket
    seen = bucket or RETRIES.retried or RETRIES.gave_up or any("gs://" in str(e) for e in _chain(error))
    if not seen:  # a run that touched no bucket: a timeout there is another story (a host, a device)
        return None
    return BucketUnavailable(
        f"the bucket{bucket} at {endpoint()} stopped answering for longer than its clients retry ({_summary(error)}; "
        f"{RETRIES.summary()}), so the run stopped: rerun the same command when the bucket answers again, and it "
        f"resumes from {Resumable.RESUME}."
    )


def unreachable(path: str, flag: str) -> Optional[Unreachable]:
    """Before any work on `path` (flag names it): the one sentence when the storage endpoint refuses connections or
    has no address (found in one attempt, not after the clients' half minute of retries); None when it answers,
    or when an HTTP proxy stands between (then the clients' own request decides)."""
    given = endpoint()
    url = urllib.parse.urlsplit(given if given.startswith(("http://", "https://")) else f"http://{given}")
    proxied = any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"))
    if proxied and not os.environ.get(EMULATOR_ENV):
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except (ConnectionRefusedError, socket.gaierror) as e:
        return unreachable_sentence(path, flag, e)
    except OSError:  # a timeout, a reset: the clients' retries decide
        return None
    return None


def unreachable_sentence(path: str, flag: str, error: BaseException) -> Unreachable:
    emulator = os.environ.get(EMULATOR_ENV, "").strip()
    fix = (
        f"start the emulator there or correct {EMULATOR_ENV}={emulator}"
        if emulator
        else "check this machine's network (and its DNS and firewall)"
    )
    return Unreachable(
        f"{flag}={path}: the storage endpoint {endpoint()} cannot be reached ({_summary(error)}); {fix}, then "
        "rerun the same command."
    )


# --- The clients' retries, counted ---------------------------------------------------------------------------


class RetryCount(logging.Filter):
    """On the loggers of gcsfs and orbax (absl): each retry or give-up of a transient failure counted, its record
    (a traceback, for a give-up) dropped, and a count logged at most every LOG_EVERY_S: "bucket: 14 request(s)
    retried so far". Records of anything else pass as they were."""

    def __init__(self) -> None:
        super().__init__()
        self.retried = self.gave_up = 0
        self.last = ""
        self._logged = 0.0
        self._lock = threading.Lock()
        self._levels: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        retried = "retrying after exception" in message
        gave_up = (error is not None and transient(error)) or "out of retries" in message
        if not (retried or gave_up):
            return record.levelno >= self._levels.get(record.name, logging.NOTSET)  # what the logger let out before
        with self._lock:
            self.retried += retried
            self.gave_up += gave_up and not retried
            self.last = type(error).__name__ if error is not None else message.rsplit(": ", 1)[-1][:80]
            now = time.monotonic()
            due = now - self._logged > LOG_EVERY_S
            if due:
                self._logged = now
        if due:
            log.warning("bucket: %s so far (last: %s); still trying", self.summary(), self.last)
        return False

    def summary(self) -> str:
        return f"{self.retried} request(s) retried" + (f", {self.gave_up} given up" if self.gave_up else "")

    def install(self) -> None:
        """On gcsfs's logger (whose retries are DEBUG records: let through to this filter, no further) and orbax's."""
        gcsfs = logging.getLogger("gcsfs")
        if self not in gcsfs.filters:
            self._levels["gcsfs"] = before = gcsfs.getEffectiveLevel()
            for child in ("gcsfs.credentials", "gcsfs.zonal_file"):  # they would inherit DEBUG, unfiltered
                if logging.getLogger(child).level == logging.NOTSET:
                    logging.getLogger(child).setLevel(before)
            gcsfs.setLevel(logging.DEBUG)
            gcsfs.addFilter(self)
        absl = logging.getLogger("absl")
        if self not in absl.filters:
            absl.addFilter(self)


RETRIES = RetryCount()
