"""Real servers for store tests, on loopback: moto's S3 server in its own process, and a fault-injecting proxy.

The proxy forwards every request to an upstream server and, when a rule matches, breaks the exchange the way
real networks and CDNs do: a connection reset mid-body, a Range ignored, a wrong Content-Range, a 503 SlowDown,
a trickle, a stall, or a hook that runs between two requests (to replace the object under a transfer).
"""

from __future__ import annotations

import http.client
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start (is moto[server] installed?)") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Rule:
    """What to break, for requests whose method and path match, `times` times (-1: always)."""

    method: str = "GET"
    path_contains: str = ""
    times: int = 1
    reset_after: int | None = None  # send this many body bytes, then break the connection
    hard_reset: bool = False  # break it with a TCP RST (in-flight bytes may be lost) instead of a clean close
    ignore_range: bool = False
    shift_content_range: int = 0
    status: int | None = None  # answer with this status (e.g. 503) instead of forwarding
    trickle_bps: int | None = None
    stall_after: int | None = None  # send this many body bytes, then nothing more for `stall_s` (then close)
    stall_s: float = 120.0
    after: Callable[[], None] | None = None  # run after the response was sent
    only_ranged: bool = False  # match only requests that carry a Range header
    hits: int = 0


@dataclass
class Plan:
    rules: list[Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    log: list[tuple[str, str, dict]] = field(default_factory=list)

    def match(self, method: str, path: str, headers) -> Rule | None:
        with self.lock:
            self.log.append((method, path, dict(headers)))
            for rule in self.rules:
                if (
                    rule.method == method
                    and rule.path_contains in path
                    and rule.times != 0
                    and (not rule.only_ranged or "Range" in headers)
                ):
                    rule.hits += 1
                    if rule.times > 0:
                        rule.times -= 1
                    return rule
        return None


class FaultProxy:
    def __init__(self, upstream_port: int) -> None:
        self.plan = Plan()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                rule = proxy.plan.match(self.command, self.path, self.headers)
                if rule and rule.status:
                    payload = (
                        b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Please reduce your request "
                        b"rate.</Message></Error>"
                    )
                    self.send_response(rule.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if rule and rule.ignore_range:
                    for name in [k for k in headers if k.lower() in ("range", "if-range", "if-match")]:
                        del headers[name]
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                upstream.request(
                    self.command, self.path, body=body, headers={**headers, "Host": f"127.0.0.1:{upstream_port}"}
                )
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        continue
                    if rule and rule.shift_content_range and name.lower() == "content-range":
                        unit, _, rest = value.partition(" ")
                        span, _, total = rest.partition("/")
                        first, _, last = span.partition("-")
                        shift = rule.shift_content_range
                        value = f"{unit} {int(first) + shift}-{int(last) + shift}/{total}"
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    pass
                elif rule and rule.reset_after is not None:
                    self.wfile.write(data[: rule.reset_after])
                    self.wfile.flush()
                    if rule.after:  # before the break, so the client's retry sees its effect
                        rule.after()
                        rule.after = None
                    if rule.hard_reset:
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    else:
                        self.connection.shutdown(socket.SHUT_WR)
                    self.close_connection = True
                    self.connection.close()
                elif rule and rule.stall_after is not None:
                    self.wfile.write(data[: rule.stall_after])
                    self.wfile.flush()
                    time.sleep(rule.stall_s)
                    self.close_connection = True
                elif rule and rule.trickle_bps:
                    for i in range(0, len(data), max(1, rule.trickle_bps // 10)):
                        self.wfile.write(data[i : i + max(1, rule.trickle_bps // 10)])
                        self.wfile.flush()
                        time.sleep(0.1)
                else:
                    self.wfile.write(data)
                upstream.close()
                if rule and rule.after:
                    rule.after()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, **kwargs) -> Rule:
        rule = Rule(**kwargs)
        with self.plan.lock:
            self.plan.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.plan.lock:
            self.plan.rules.clear()
            self.plan.log.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
