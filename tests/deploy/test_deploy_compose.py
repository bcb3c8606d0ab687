"""docker-compose.yml: valid under the Compose Specification, and wired the way the service needs.

No Docker engine runs here, so the file is checked statically: against the specification's JSON
schema with ``check-jsonschema``, then for what it means (files it mounts exist, dependencies
wait for health, the rules and dashboards are the ones in ``deploy/``, the env file's example
lists every variable it reads).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import sync_chart_files
from service.api.health import router as health_router
from service.api.scrape import router as scrape_router
from service.cli import main as cli
from service.config.settings import Settings
from service.process.exposure import open_remote_refusal
from tests.support.paths import REPO_ROOT, shared_data_dir

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
APP_SERVICES = ("migrate", "api", "worker", "scheduler")
DATA_DIR = "/var/lib/retrieval-monitor"
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def config_content(compose: dict[str, Any], name: str) -> dict[str, Any]:
    content: dict[str, Any] = yaml.safe_load(compose["configs"][name]["content"])
    return content


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of each bind mount in the short volume syntax."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def datasource_uids(node: Any) -> list[str]:
    """The uid of every data source a dashboard (or part of one) refers to."""
    if isinstance(node, list):
        return [uid for item in node for uid in datasource_uids(item)]
    if not isinstance(node, dict):
        return []
    found = []
    for key, value in node.items():
        if key == "datasource" and isinstance(value, dict) and "uid" in value:
            found.append(str(value["uid"]))
        else:
            found.extend(datasource_uids(value))
    return found


def env_example() -> dict[str, str]:
    pairs = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


# --- the specification --------------------------------------------------------------------------


def check_jsonschema(document: Path) -> subprocess.CompletedProcess[str]:
    schema = shared_data_dir() / "compose-spec" / "compose-spec.json"
    if not schema.is_file():
        pytest.skip(f"the Compose Specification's schema is not at {schema} (../shared/data)")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(document)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.shared_data
def test_compose_file_meets_the_compose_specification() -> None:
    result = check_jsonschema(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.shared_data
def test_the_schema_check_catches_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE_FILE.read_text().replace("service_completed_successfully", "service_finished", 1)
    )
    result = check_jsonschema(broken)
    assert result.returncode != 0
    assert "depends_on" in result.stdout


# --- files and images -----------------------------------------------------------------------------


def test_every_file_it_mounts_or_builds_from_exists(compose: dict[str, Any]) -> None:
    missing = []
    for name, service in services(compose).items():
        for source, _ in bind_mounts(service):
            if not (REPO_ROOT / source).exists():
                missing.append(f"{name}: {source}")
        build = service.get("build")
        if (
            build
            and not (REPO_ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
        ):
            missing.append(f"{name}: build context {build}")
    for name, config in compose.get("configs", {}).items():
        if "file" in config and not (REPO_ROOT / config["file"]).exists():
            missing.append(f"config {name}: {config['file']}")
    assert missing == []


def test_app_services_share_one_image_and_take_their_role_from_the_command(
    compose: dict[str, Any],
) -> None:
    found = services(compose)
    assert len({found[name]["image"] for name in APP_SERVICES}) == 1
    assert {found[name]["build"]["target"] for name in APP_SERVICES} == {"runtime"}
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+ AS runtime$", dockerfile, re.MULTILINE)
    parser = cli.build_parser()
    roles = {name: parser.parse_args(found[name]["command"]).command for name in APP_SERVICES}
    assert roles == {name: name if name != "api" else "serve" for name in APP_SERVICES}
    api = parser.parse_args(found["api"]["command"])
    assert api.no_worker
    assert api.host == "0.0.0.0"


def test_app_containers_write_only_to_their_tmpfs(compose: dict[str, Any]) -> None:
    for name in APP_SERVICES:
        service = services(compose)[name]
        assert service["read_only"] is True
        tmpfs = dict(entry.split(":", 1) for entry in service["tmpfs"])
        assert set(tmpfs) == {"/tmp", DATA_DIR}
        # The image runs as an unprivileged user; the folders must be writable for it.
        assert all("mode=1777" in options.split(",") for options in tmpfs.values())
        assert service["environment"]["RM_DATA_DIR"] == DATA_DIR
        assert service["cap_drop"] == ["ALL"]


# --- order and health ---------------------------------------------------------------------------


def test_migrations_run_once_before_the_app(compose: dict[str, Any]) -> None:
    found = services(compose)
    migrate = found["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker", "scheduler"):
        assert found[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


def test_services_wait_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    found = services(compose)
    for name, service in found.items():
        if name != "migrate":
            assert service["healthcheck"]["test"], name
        for dependency, rule in service.get("depends_on", {}).items():
            wanted = (
                "service_completed_successfully" if dependency == "migrate" else "service_healthy"
            )
            assert rule["condition"] == wanted, f"{name} -> {dependency}"
            if wanted == "service_healthy":
                assert not found[dependency]["healthcheck"].get("disable"), dependency
    assert found["api"]["depends_on"].keys() >= {"postgres", "redis", "migrate"}


def test_healthchecks_probe_real_endpoints_and_processes(compose: dict[str, Any]) -> None:
    found = services(compose)
    routes = {r.path for r in health_router.routes}  # type: ignore[attr-defined]
    api_check = " ".join(found["api"]["healthcheck"]["test"])
    (path,) = re.findall(r"http://127\.0\.0\.1:8080(/\w+)", api_check)
    assert path in routes
    worker_check = found["worker"]["healthcheck"]["test"][1]
    assert "-A workers.celery_app inspect ping" in worker_check
    # $$ is compose's escape: the shell in the container expands $HOSTNAME, Celery's node name.
    assert "celery@$$HOSTNAME" in worker_check
    scheduler_check = found["scheduler"]["healthcheck"]["test"][1]
    pattern = re.search(r"-name '([^']+)'", scheduler_check)
    assert pattern is not None
    assert DATA_DIR in scheduler_check
    assert fnmatch.fnmatch("celerybeat-schedule", pattern.group(1))


def test_a_stopping_worker_has_time_to_finish_a_judge_call(compose: dict[str, Any]) -> None:
    grace = services(compose)["worker"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)(s|m)", grace)
    assert match is not None
    seconds = int(match.group(1)) * (60 if match.group(2) == "m" else 1)
    assert seconds >= Settings().judge_timeout_seconds


# --- the backing services -----------------------------------------------------------------------


def test_redis_is_configured_as_a_queue(compose: dict[str, Any]) -> None:
    redis = services(compose)["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "--maxmemory" in command  # without a limit the policy never applies
    assert "redis-data:/data" in redis["volumes"]
    assert "ports" not in redis


def test_postgres_keeps_its_data_in_a_volume(compose: dict[str, Any]) -> None:
    postgres = services(compose)["postgres"]
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert "postgres-data" in compose["volumes"]
    assert "ports" not in postgres
    database_url = services(compose)["api"]["environment"]["RM_DATABASE_URL"]
    assert "@postgres:5432/" + postgres["environment"]["POSTGRES_DB"] in database_url
    assert database_url.startswith(
        f"postgresql+psycopg://{postgres['environment']['POSTGRES_USER']}:"
    )


def test_published_ports_listen_on_loopback_by_default(compose: dict[str, Any]) -> None:
    published = {
        name: service["ports"] for name, service in services(compose).items() if "ports" in service
    }
    assert set(published) == {"api", "prometheus", "alertmanager", "grafana"}
    for ports in published.values():
        for port in ports:
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), port


# --- Prometheus, Alertmanager, Grafana -----------------------------------------------------------


def test_prometheus_loads_exactly_the_rules_of_deploy(compose: dict[str, Any]) -> None:
    prometheus = services(compose)["prometheus"]
    config = config_content(compose, "prometheus")
    mounted = {
        Path(source).relative_to("."): target
        for source, target in bind_mounts(prometheus)
        if any(fnmatch.fnmatch(target, pattern) for pattern in config["rule_files"])
    }
    assert set(mounted) == set(sync_chart_files.rule_files(REPO_ROOT))
    assert mounted


def test_prometheus_scrapes_the_api_as_the_job_the_rules_select(compose: dict[str, Any]) -> None:
    config = config_content(compose, "prometheus")
    example = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    # The example config of deploy/, with this network's addresses.
    assert config["global"] == example["global"]
    assert [job["job_name"] for job in config["scrape_configs"]] == [
        job["job_name"] for job in example["scrape_configs"]
    ]
    (job,) = config["scrape_configs"]
    rules_text = "\n".join(
        (REPO_ROOT / path).read_text() for path in sync_chart_files.rule_files(REPO_ROOT)
    )
    assert set(re.findall(r'job="([^"]+)"', rules_text)) == {job["job_name"]}
    assert job["static_configs"] == [{"targets": ["api:8080"]}]
    assert job.get("metrics_path", "/metrics") in {r.path for r in scrape_router.routes}  # type: ignore[attr-defined]
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"] == [{"targets": ["alertmanager:9093"]}]


def test_promtool_accepts_the_prometheus_config_with_its_mounted_rules(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (scripts/install-test-tools.sh installs it)")
    config = config_content(compose, "prometheus")
    # The mounts, replayed into a folder: each rule file where the config's glob finds it.
    patterns = config["rule_files"]
    rules = tmp_path / "rules"
    rules.mkdir()
    for source, target in bind_mounts(services(compose)["prometheus"]):
        if any(fnmatch.fnmatch(target, pattern) for pattern in patterns):
            shutil.copy(REPO_ROOT / source, rules / Path(target).name)
    config["rule_files"] = [str(rules / Path(pattern).name) for pattern in patterns]
    # The scrape token's secret, where the config reads it.
    (job,) = config["scrape_configs"]
    token = tmp_path / "metrics_token"
    token.write_text("0123456789abcdef0123\n")
    job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    assert "rules found" in result.stdout + result.stderr


def test_alertmanager_runs_the_example_config(compose: dict[str, Any]) -> None:
    alertmanager = services(compose)["alertmanager"]
    flag = next(a for a in alertmanager["command"] if a.startswith("--config.file="))
    target = flag.split("=", 1)[1]
    (source,) = [s for s, t in bind_mounts(alertmanager) if t == target]
    assert Path(source) == Path("deploy/alertmanager/alertmanager.yml")
    assert "route" in yaml.safe_load((REPO_ROOT / source).read_text())


def test_grafana_provisions_the_datasource_and_the_dashboards_of_deploy(
    compose: dict[str, Any],
) -> None:
    grafana = services(compose)["grafana"]
    mounts = dict(bind_mounts(grafana))
    provider_file = next(s for s, t in mounts.items() if "/provisioning/dashboards/" in t)
    provider = yaml.safe_load((REPO_ROOT / provider_file).read_text())
    (dashboards_path,) = [p["options"]["path"] for p in provider["providers"]]
    dashboards_source = next(s for s, t in mounts.items() if t == dashboards_path)
    shipped = {p.name for p in (REPO_ROOT / dashboards_source).glob("*.json")}
    assert shipped == {p.name for p in sync_chart_files.dashboard_files(REPO_ROOT)}
    assert shipped

    (datasource,) = config_content(compose, "grafana-datasources")["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    example_dir = REPO_ROOT / "deploy" / "grafana" / "provisioning" / "datasources"
    (example,) = [
        ds
        for path in example_dir.glob("*.y*ml")
        for ds in yaml.safe_load(path.read_text())["datasources"]
    ]
    assert {k: v for k, v in datasource.items() if k != "url"} == {
        k: v for k, v in example.items() if k != "url"
    }
    # Every panel either picks the data source through the dashboard variable or names this one.
    for name in shipped:
        dashboard = json.loads((REPO_ROOT / dashboards_source / name).read_text())
        uids = set(datasource_uids(dashboard))
        assert uids, name
        assert uids <= {"${datasource}", "-- Grafana --", datasource["uid"]}, name


# --- the env file ---------------------------------------------------------------------------------


def test_the_llm_endpoint_and_key_come_from_the_env_file(compose: dict[str, Any]) -> None:
    for name in APP_SERVICES:
        assert services(compose)[name]["env_file"] == [{"path": ".env", "required": True}]
    example = env_example()
    assert {"RM_JUDGE_BASE_URL", "RM_JUDGE_MODEL", "RM_JUDGE_API_KEY"} <= set(example)
    assert example["RM_JUDGE_API_KEY"] == ""


def test_env_example_lists_every_variable_and_defaults_no_secret() -> None:
    text = COMPOSE_FILE.read_text()
    example = env_example()
    used = {match.group(1) for match in VARIABLE.finditer(text)}
    assert used <= set(example)
    required = {m.group(1) for m in VARIABLE.finditer(text) if m.group(2) in {":?", "?"}}
    assert required == {"POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD"}
    assert all(example[name] == "" for name in required)


def test_rm_variables_are_real_settings(compose: dict[str, Any]) -> None:
    known = {f"RM_{name.upper()}" for name in Settings.model_fields}
    in_example = {name for name in env_example() if name.startswith("RM_")}
    assert in_example <= known
    for name in APP_SERVICES:
        assert set(services(compose)[name]["environment"]) <= known


def test_the_api_comes_up_with_keys_required(compose: dict[str, Any]) -> None:
    environment = services(compose)["api"]["environment"]
    # "${RM_AUTH_REQUIRED:-true}": on unless .env says otherwise.
    assert re.fullmatch(r"\$\{RM_AUTH_REQUIRED:-true\}", environment["RM_AUTH_REQUIRED"])
    api = cli.build_parser().parse_args(services(compose)["api"]["command"])
    settings = Settings.model_validate({"host": api.host, "auth_required": True})
    assert open_remote_refusal(settings) is None
    assert open_remote_refusal(settings.model_copy(update={"auth_required": False}))


def test_metrics_need_a_credential_and_prometheus_presents_one(compose: dict[str, Any]) -> None:
    """Keys on (the default) close /metrics too: nothing in the file opens it again, and the
    bundled Prometheus scrapes with the scrape token the API reads from the same secret."""
    api = services(compose)["api"]
    environment = api["environment"]
    assert "RM_METRICS_AUTH" not in environment  # unset: a credential whenever keys are on
    settings = Settings.model_validate({"auth_required": True})
    assert settings.metrics_need_key
    token_file = environment["RM_METRICS_TOKEN_FILE"]
    (secret,) = {Path(token_file).name} & set(compose["secrets"])
    assert token_file == f"/run/secrets/{secret}"
    assert secret in api["secrets"]
    assert secret in services(compose)["prometheus"]["secrets"]
    for name in APP_SERVICES:
        if name != "api":
            assert secret not in services(compose)[name].get("secrets", [])
    (job,) = config_content(compose, "prometheus")["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": token_file}
    # The token comes from .env, where the example leaves it empty for the operator to fill.
    variable = compose["secrets"][secret]["environment"]
    assert env_example()[variable] == ""
    assert "RM_METRICS_AUTH" not in env_example()
