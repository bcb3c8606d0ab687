"""A stand-in for the monitor on 127.0.0.1 that answers each request as a script says: well, or
with garbage, truncated or deeply nested JSON, an endless body, a server error, a closed
connection, or an answer held until the test lets it go. Requests past the script are answered
well, so a client that keeps retrying always gets through in the end."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import socketserver
import threading
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import Any

BEHAVIOURS = (
    "ok",
    "reject_every_other",
    "garbage",
    "truncated",
    "short_body",
    "deep",
    "deep_results",
    "wrong_count",
    "endless",
    "server_error",
    "unavailable",
    "unauthorized",
    "close",
    "held",
)
ENDLESS_LIMIT = 64 << 20
"""How much of an endless body the server sends at most, if the client reads on."""


class HostileMonitor:
    def __init__(self) -> None:
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._lock = threading.Lock()
        self._script: deque[str] = deque()
        self._seen: set[Any] = set()
        self.release = threading.Event()
        """Held answers wait for this."""
        self.acknowledged = 0
        """Events answered accepted or duplicate in an answer sent whole."""
        self.largest_body_sent = 0

    def play(self, script: Iterable[str]) -> None:
        """Answer the next requests as ``script`` says, then well."""
        with self._lock:
            self._script = deque(script)
            self._seen = set()
            self.acknowledged = 0
            self.largest_body_sent = 0
        self.release.clear()

    def __enter__(self) -> HostileMonitor:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _next_behaviour(self) -> str:
        with self._lock:
            return self._script.popleft() if self._script else "ok"

    def _handler(self) -> type[socketserver.BaseRequestHandler]:
        monitor = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError):
                    path, body = _read_request(self.rfile)
                    monitor._answer(self.connection, path, body, monitor._next_behaviour())

        return Handler

    def _answer(self, conn: socket.socket, path: str, body: bytes, behaviour: str) -> None:
        if behaviour == "close":
            return
        if behaviour == "held":
            self.release.wait()
            behaviour = "ok"
        if behaviour == "endless":
            self._send_endless(conn)
            return
        status, payload, acknowledged = self._payload(path, body, behaviour)
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n"
        if behaviour == "unavailable":
            head += "Retry-After: whenever\r\n"
        length = len(payload) * 2 if behaviour == "short_body" else len(payload)
        counted = 0 if behaviour == "short_body" else acknowledged
        # Counted before the answer leaves: once the client has read it, the test may compare
        # its books with this count at once. Taken back if the answer could not be sent.
        with self._lock:
            self.acknowledged += counted
        try:
            conn.sendall(f"{head}Content-Length: {length}\r\n\r\n".encode() + payload)
        except OSError:
            with self._lock:
                self.acknowledged -= counted
            raise

    def _payload(self, path: str, body: bytes, behaviour: str) -> tuple[str, bytes, int]:
        """The status line, the body, and how many events it acknowledges."""
        if behaviour == "server_error":
            return "500 Internal Server Error", b'{"detail":"boom"}', 0
        if behaviour == "unavailable":
            return "503 Service Unavailable", b"", 0
        if behaviour == "unauthorized":
            return "401 Unauthorized", b'{"detail":"bad key"}', 0
        if behaviour == "garbage":
            return "200 OK", b"\x00\xff{results: ]]", 0
        if behaviour == "deep":
            return "200 OK", b"[" * 100_000 + b"]" * 100_000, 0
        if not path.endswith("/batch"):
            return "200 OK", b"{}", 0
        events = json.loads(gzip.decompress(body))["events"]
        results: list[Any] = []
        acknowledged = 0
        for number, event in enumerate(events):
            if behaviour == "reject_every_other" and number % 2:
                results.append({"status": "rejected", "error": "refused by the script"})
            elif behaviour == "deep_results":
                results.append({"status": _nested(500)})
            else:
                key = json.dumps(event.get("event_id"))
                results.append({"status": "duplicate" if key in self._seen else "accepted"})
                self._seen.add(key)
                acknowledged += 1
        if behaviour == "wrong_count":
            results.append({"status": "accepted"})
            acknowledged = 0
        payload = json.dumps({"results": results}).encode()
        if behaviour == "truncated":
            return "200 OK", payload[: len(payload) // 2], 0
        return "200 OK", payload, acknowledged

    def _send_endless(self, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        chunk = b"[" * 65536
        sent = 0
        try:
            while sent < ENDLESS_LIMIT:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            conn.sendall(b"0\r\n\r\n")
        finally:
            with self._lock:
                self.largest_body_sent = max(self.largest_body_sent, sent)


def _read_request(stream: Any) -> tuple[str, bytes]:
    request_line = stream.readline().decode("latin-1")
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    parts = request_line.split()
    return (parts[1] if len(parts) > 1 else ""), stream.read(length)


def _nested(depth: int) -> Any:
    value: Any = "accepted"
    for _ in range(depth):
        value = [value]
    return value
