"""A TCP proxy in front of the real service that can hold back its answers: a slow service whose
requests still arrive and commit, while the client sees nothing until the test lets go."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class StallingProxy:
    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._answers_flow = threading.Event()
        self._answers_flow.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self.requests = 0
        """Chunks that opened an HTTP request, as they reached the service."""

    def hold_answers(self) -> None:
        self._answers_flow.clear()

    def release_answers(self) -> None:
        self._answers_flow.set()

    def __enter__(self) -> StallingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closed = True
        self._answers_flow.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            self._sockets += [downstream, upstream]
            threading.Thread(
                target=self._pump, args=(downstream, upstream, False), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, downstream, True), daemon=True
            ).start()

    def _pump(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if answers:
                    self._answers_flow.wait()
                elif chunk.startswith(b"POST "):
                    self.requests += 1
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
