"""The judge queue's brokers for the tests: emptying a queue on either; RabbitMQ, the machine's
server (a virtual host of the test session's own, so nothing a run declares outlives it) and
private nodes a test can kill and start again."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from kombu.connection import Connection

from service.process.embedded import free_port
from service.queue.broker import BrokerQueues
from tests.support.live import wait_for

_Connection: Any = Connection  # kombu has no type hints

RABBITMQ_URL = os.environ.get("RM_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
# The server script itself: Debian's /usr/sbin wrapper would switch to the rabbitmq user, which
# cannot enter a test's temporary folder.
_SERVER_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)


def empty_queue(broker_url: str, queue: str) -> None:
    """Drop every message waiting in ``queue``, on a Redis broker or an AMQP one."""
    queues = BrokerQueues(broker_url)
    if queues.redis is not None:
        queues.redis.delete(queue)
        return
    with _Connection(broker_url) as connection:
        connection.default_channel.queue_purge(queue)


def answers(url: str) -> bool:
    try:
        BrokerQueues(url).ping()
    except Exception:
        return False
    return True


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@contextmanager
def session_vhost(url: str) -> Iterator[str]:
    """``url`` on a virtual host made for this test session and deleted after it, when
    rabbitmqctl can reach the server (it is local); else ``url`` as it is."""
    if shutil.which("rabbitmqctl") is None or "127.0.0.1" not in url:
        yield url
        return
    vhost = f"rm-test-{uuid.uuid4().hex[:10]}"
    try:
        _rabbitmqctl("add_vhost", vhost)
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (subprocess.SubprocessError, OSError):
        yield url  # no rights on the node: the default virtual host, with unique queue names
        return
    try:
        parts = urlsplit(url)
        yield f"{parts.scheme}://{parts.netloc}/{quote(vhost, safe='')}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


class RabbitMQNode:
    """A RabbitMQ node of the test's own on a free port, with its data in a folder of its own:
    SIGKILLed and started again there, it comes back with what it had written to disk, as a
    restarted broker does."""

    def __init__(self) -> None:
        script = next((s for s in _SERVER_SCRIPTS if Path(s).exists()), None)
        script = script or shutil.which("rabbitmq-server")
        if script is None:
            pytest.skip("rabbitmq-server is not installed")
        self.script = script
        self.folder = Path(tempfile.mkdtemp(prefix="rm-rabbitmq-"))
        self.port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        (self.folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            # guest may connect only from localhost, which this node is reached from
            "loopback_users.guest = true\n"
        )
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "rabbitmq-env.conf").write_text("")
        self.name = f"rm-test-{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_DIST_PORT": str(free_port()),
        }

    def start(self) -> RabbitMQNode:
        log = (self.folder / "console.log").open("ab")
        self.process = subprocess.Popen(
            [self.script],
            env=self._env(),
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the Erlang VM dies with it
        )
        try:
            wait_for(self._accepts, timeout=90, interval=0.3)
        except AssertionError:
            raise RuntimeError(f"RabbitMQ node did not start: {self.console()[-3000:]}") from None
        return self

    def console(self) -> str:
        return (self.folder / "console.log").read_text(errors="replace")

    def _accepts(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"RabbitMQ node exited: {self.console()[-3000:]}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        return answers(self.url)

    def kill(self) -> None:
        """SIGKILL the whole node at once, as a crash or a lost machine."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)
