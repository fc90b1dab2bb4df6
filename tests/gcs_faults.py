"""A proxy in front of the GCS emulator that fails requests on purpose: 503 and 429 answers (what GCS sends
when it is overloaded or a caller is over its rate), an outage (every connection dropped unanswered) for
a while, and a delay on every request (a slow, distant bucket: benchmarks/bucket.py). The clients reach it
through their standard emulator settings, as they reach the emulator.

    with FaultyProxy(emulator_url) as proxy:
        proxy.fail_every(5)             # every 5th request: 503, 429, 503, ...
        proxy.outage(3.0)               # the next 3 seconds: no answers
        proxy.wait_for_outage_end()     # until the bucket answers again
        proxy.delay(0.05)               # every request answered 50 ms late
        proxy.forbid()                  # every request refused: 403
        env = client_settings(proxy.url)
"""

from __future__ import annotations

import http.client
import http.server
import itertools
import json
import socket
import socketserver
import threading
import time
import urllib.parse

FAILURES = ((503, "Service Unavailable", "backendError"), (429, "Too Many Requests", "rateLimitExceeded"))
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class FaultyProxy:
    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.upstream_url = upstream.rstrip("/")
        self._every = 0
        self._delay = 0.0
        self._forbidden = False
        self._outage_until = 0.0
        self._outage_drops = 0  # an outage also lasts until it has dropped this many connections
        self._count = itertools.count(1)
        self._failure = itertools.cycle(FAILURES)
        self._lock = threading.Lock()
        self.failed = 0  # requests answered 503/429
        self.failed_by: dict[str, int] = {}  # ... by client (the User-Agent's first word)
        self.dropped = 0  # connections dropped during an outage
        self.forwarded = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                verdict = proxy._verdict(self.headers.get("User-Agent", "?"))
                if verdict == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if verdict is not None:
                    code, reason, why = verdict
                    payload = json.dumps({"error": {"code": code, "message": reason, "errors": [{"reason": why}]}})
                    self.send_response(code, reason)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload.encode())
                    return
                status, reason, headers, data = proxy._forward(self.command, self.path, self.headers, body)
                self.send_response(status, reason)
                for key, value in headers:
                    if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value.replace(proxy.upstream_url, proxy.url))  # resumable uploads
                if "json" in dict((k.lower(), v) for k, v in headers).get("content-type", ""):
                    data = data.replace(proxy.upstream_url.encode(), proxy.url.encode())  # mediaLink, selfLink
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address) -> None:  # a client that gave up: not news
                pass

        self._server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FaultyProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_every(self, n: int) -> None:
        """Answer every n-th request with 503 or 429 in turn (0: none)."""
        self._every = n

    def forbid(self) -> None:
        """Answer every request 403 (credentials the bucket does not accept)."""
        self._forbidden = True

    def delay(self, seconds: float) -> None:
        """Answer every request `seconds` late."""
        self._delay = seconds

    def outage(self, seconds: float, until_dropped: int = 0) -> None:
        """Drop every connection unanswered for the next `seconds`, and past them until `until_dropped` connections
        were dropped: a client busy computing (a loaded CI machine) may make no request in a short outage."""
        with self._lock:
            self._outage_until = time.monotonic() + seconds
            self._outage_drops = self.dropped + until_dropped

    def _in_outage(self) -> bool:
        return time.monotonic() < self._outage_until or self.dropped < self._outage_drops

    def wait_for_outage_end(self) -> None:
        """Returns once the outage (if any) is over: the bucket answers again."""
        while self._in_outage():
            time.sleep(0.1)

    def _verdict(self, agent: str):
        with self._lock:
            if self._forbidden:
                return (403, "Forbidden", "forbidden")
            if self._in_outage():
                self.dropped += 1
                return "drop"
            if self._every and next(self._count) % self._every == 0:
                self.failed += 1
                client = agent.split("/")[0].split()[0].lower()  # gcsfs's aiohttp, tensorstore's curl
                self.failed_by[client] = self.failed_by.get(client, 0) + 1
                return next(self._failure)
            self.forwarded += 1
            return None

    def _forward(self, method: str, path: str, headers, body: bytes):
        if self._delay:
            time.sleep(self._delay)
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
            connection.request(method, path, body=body or None, headers=sent)
            response = connection.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            connection.close()
