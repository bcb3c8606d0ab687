"""The Helm chart: lint, render every ci/ scenario, validate the objects, assert what they say.

Rendering uses Helm's own Go code through ``helm-python-sdk`` (no helm binary, no cluster). Core
Kubernetes objects are validated with ``kubernetes-validate`` in strict mode (unknown fields are
errors) against the oldest and newest Kubernetes the chart supports; the custom resources of the
Prometheus Operator and KEDA, which those schemas do not cover, go through the typed models of
``cloudcoil-models-*``, and must come back unchanged (a dropped field is an unknown field).
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from scripts import sync_chart_files
from service.api.health import router as health_router
from service.api.scrape import router as scrape_router
from service.config.settings import Settings
from service.process.worker import worker_command
from tests.support.paths import REPO_ROOT

CHART = REPO_ROOT / "helm" / "retrieval-monitor"
CI_DIR = CHART / "ci"
RELEASE = "rm"
NAMESPACE = "observability"
# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest with schemas.
KUBE_VERSIONS = ("1.25.0", "1.37.0")
SECRET_SETTINGS = ("RM_DATABASE_URL", "RM_REDIS_URL", "RM_JUDGE_API_KEY")
# Secret when set, and set only when the judge queue has a broker of its own.
BROKER_SETTING = "RM_BROKER_URL"
DATA_DIR = "/var/lib/retrieval-monitor"
CRD_MODELS = {
    "ServiceMonitor": ("cloudcoil.models.prometheus_operator.v1", "ServiceMonitor"),
    "PrometheusRule": ("cloudcoil.models.prometheus_operator.v1", "PrometheusRule"),
    "ScaledObject": ("cloudcoil.models.keda.v1alpha1", "ScaledObject"),
    "TriggerAuthentication": ("cloudcoil.models.keda.v1alpha1", "TriggerAuthentication"),
}

Manifest = dict[str, Any]


# --- rendering ------------------------------------------------------------------------------------


def ci_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CI_DIR / f"{name}-values.yaml").read_text())
    return values


CI_SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in CI_DIR.glob("*-values.yaml"))


@pytest.fixture(scope="module", autouse=True)
def quiet_helm() -> None:
    # Lint reports what the templates' `fail` would say through Helm's log; the tests read the
    # report instead.
    helm.disable_logging()


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_files(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(chart: helm.Chart, values: dict[str, Any]) -> list[Manifest]:
    manifests: list[Manifest] = []
    for name, text in render_files(chart, values).items():
        if name.endswith("NOTES.txt"):
            continue
        manifests.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return manifests


@pytest.fixture(scope="module")
def rendered(chart: helm.Chart) -> dict[str, list[Manifest]]:
    return {scenario: render(chart, ci_values(scenario)) for scenario in CI_SCENARIOS}


def only(manifests: list[Manifest], kind: str, component: str | None = None) -> Manifest:
    found = of_kind(manifests, kind, component)
    assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
    return found[0]


def of_kind(manifests: list[Manifest], kind: str, component: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] == kind
        and (
            component is None
            or m["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
    ]


def pod_spec(manifest: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def container(manifest: Manifest) -> dict[str, Any]:
    containers = pod_spec(manifest)["containers"]
    assert len(containers) == 1
    first: dict[str, Any] = containers[0]
    return first


def is_hook(manifest: Manifest) -> bool:
    return "helm.sh/hook" in manifest["metadata"].get("annotations", {})


def env_names(manifest: Manifest) -> list[str]:
    return [e["name"] for e in container(manifest).get("env", [])]


# --- the chart as a whole -----------------------------------------------------------------------


def test_the_ci_scenarios_exist() -> None:
    assert {"minimal", "full", "existing-secret", "rabbitmq"} <= set(CI_SCENARIOS)


@pytest.mark.parametrize("scenario", ["default", *CI_SCENARIOS])
def test_lint_reports_nothing_from_the_source_folder(scenario: str) -> None:
    """No `helm dependency build`, no network: the chart lints as it is checked out."""
    values = None if scenario == "default" else ci_values(scenario)
    for kube in KUBE_VERSIONS:
        report = helm.lint(CHART, values, kube_version=f"v{kube}")
        assert report["errors"] == []
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert problems == []


def test_the_chart_downloads_nothing_and_the_companions_are_off(chart: helm.Chart) -> None:
    assert not chart.metadata.get("dependencies")
    assert helm.dependency_list(CHART) == []
    assert chart.values["postgresql"]["enabled"] is False
    assert chart.values["redis"]["enabled"] is False


def test_the_default_install_requires_keys_and_a_scrape_key(chart: helm.Chart) -> None:
    assert chart.values["config"]["RM_AUTH_REQUIRED"] == "true"
    values = {**ci_values("minimal"), "serviceMonitor": {"enabled": True}}
    with pytest.raises(helm.HelmRenderError, match="authorizationSecret"):
        render(chart, values)


@pytest.mark.parametrize("scenario", CI_SCENARIOS)
def test_ci_values_meet_the_schema(chart: helm.Chart, scenario: str) -> None:
    chart.validate_schema(ci_values(scenario))


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"config": {"RM_JUDGE_API_KEY": "sk-x"}}, "RM_JUDGE_API_KEY"),
        ({"config": {"RM_DATABASE_URL": "postgresql://u:p@h/d"}}, "RM_DATABASE_URL"),
        ({"config": {"RM_ALPHA": 0.3}}, "/config/RM_ALPHA"),
        ({"api": {"replicas": "two"}}, "/api/replicas"),
        ({"replicaCount": 3}, "replicaCount"),
        ({"externalRedis": {"url": "localhost:6379"}}, "/externalRedis/url"),
        ({"externalBroker": {"url": "rabbitmq:5672"}}, "/externalBroker/url"),
        ({"config": {"RM_BROKER_URL": "amqp://u:p@h//"}}, "RM_BROKER_URL"),
    ],
)
def test_schema_refuses_bad_values(
    chart: helm.Chart, override: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema({**ci_values("minimal"), **override})


def test_render_fails_without_a_database_or_redis(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="needs a database"):
        render(chart, {"externalRedis": {"url": "redis://r:6379/0"}})
    with pytest.raises(helm.HelmRenderError, match="needs Redis"):
        render(chart, {"externalDatabase": {"url": "postgresql+psycopg://u:p@h/d"}})


def test_values_yaml_is_commented_line_by_line() -> None:
    uncommented = []
    previous = ""
    in_list_item = False
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("- "):
            in_list_item = True
        elif re.match(r"^\s*[A-Za-z_][\w.-]*:", line):
            indent = len(line) - len(line.lstrip())
            in_list_item = in_list_item and indent > 2
            if not in_list_item and not previous.startswith("#"):
                uncommented.append(f"{number}: {stripped}")
        previous = stripped
    assert uncommented == []


def test_values_schema_covers_every_top_level_key(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert schema["additionalProperties"] is False
    assert set(chart.values) <= set(schema["properties"])


# --- validation against Kubernetes' schemas -----------------------------------------------------


def _crd_model(kind: str) -> Any:
    module_name, class_name = CRD_MODELS[kind]
    # Imported by name: the generated modules are megabytes of models.
    return getattr(importlib.import_module(module_name), class_name)


def validation_errors(manifest: Manifest, kube: str) -> list[str]:
    """Why ``manifest`` is not a valid object for Kubernetes ``kube``; empty when it is."""
    kind = manifest["kind"]
    name = f"{kind}/{manifest['metadata']['name']}"
    if kind in CRD_MODELS:
        try:
            model = _crd_model(kind).model_validate(manifest)
        except ValueError as exc:  # pydantic's ValidationError
            return [f"{name}: {exc}"]
        back = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        if back != manifest:
            return [f"{name}: fields unknown to the {kind} schema (they did not survive a load)"]
        return []
    try:
        kubernetes_validate.validate(manifest, kube, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{name}: {'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{name}: {exc.message}"]
    return []


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", CI_SCENARIOS)
def test_every_rendered_object_is_valid(
    rendered: dict[str, list[Manifest]], scenario: str, kube: str
) -> None:
    manifests = rendered[scenario]
    assert manifests
    errors = [e for m in manifests for e in validation_errors(m, kube)]
    assert errors == []


def test_the_validators_reject_unknown_fields(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    deployment = json.loads(json.dumps(only(manifests, "Deployment", "api")))
    container(deployment)["livenesProbe"] = {"httpGet": {"path": "/healthz", "port": "http"}}
    assert validation_errors(deployment, KUBE_VERSIONS[0])
    rule = json.loads(json.dumps(only(manifests, "PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["expresion"] = "up"
    assert validation_errors(rule, KUBE_VERSIONS[0])
    scaled = json.loads(json.dumps(only(manifests, "ScaledObject")))
    del scaled["spec"]["scaleTargetRef"]
    assert validation_errors(scaled, KUBE_VERSIONS[0])


def test_the_full_scenario_renders_every_kind(rendered: dict[str, list[Manifest]]) -> None:
    kinds = {m["kind"] for m in rendered["full"]}
    assert kinds >= {
        "Deployment",
        "Service",
        "Ingress",
        "ConfigMap",
        "Secret",
        "ServiceAccount",
        "ServiceMonitor",
        "PrometheusRule",
        "ScaledObject",
        "TriggerAuthentication",
        "PodDisruptionBudget",
        "Job",
    }
    minimal = {m["kind"] for m in rendered["minimal"]}
    assert not minimal & {"ServiceMonitor", "PrometheusRule", "Ingress", "ScaledObject"}


# --- what the objects say -------------------------------------------------------------------------


def deploy_rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in sync_chart_files.rule_files(REPO_ROOT):
        groups.extend(yaml.safe_load((REPO_ROOT / path).read_text())["groups"])
    return groups


def test_prometheus_rule_carries_exactly_the_rules_of_deploy(
    rendered: dict[str, list[Manifest]],
) -> None:
    groups = deploy_rule_groups()
    assert groups, "deploy/prometheus holds no rule file"
    rule = only(rendered["full"], "PrometheusRule")
    assert rule["spec"]["groups"] == groups
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboards_configmap_carries_the_dashboards_of_deploy(
    rendered: dict[str, list[Manifest]],
) -> None:
    sources = sync_chart_files.dashboard_files(REPO_ROOT)
    assert sources, "deploy/grafana/dashboards holds no dashboard"
    maps = [
        m
        for m in rendered["full"]
        if m["kind"] == "ConfigMap" and "grafana_dashboard" in m["metadata"]["labels"]
    ]
    assert len(maps) == 1
    dashboards = maps[0]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "Retrieval quality"}
    assert set(dashboards["data"]) == {p.name for p in sources}
    for path in sources:
        shipped = json.loads(dashboards["data"][path.name])
        assert shipped == json.loads((REPO_ROOT / path).read_text())


def test_the_chart_copies_of_rules_and_dashboards_have_not_drifted() -> None:
    assert sync_chart_files.expected_copies(REPO_ROOT)
    assert sync_chart_files.drift(REPO_ROOT) == [], "run: python scripts/sync_chart_files.py"


def test_drift_check_notices_a_changed_missing_or_orphaned_copy(tmp_path: Path) -> None:
    rules = tmp_path / "deploy" / "prometheus"
    rules.mkdir(parents=True)
    (rules / "rules.yml").write_text("groups: []\n")
    (rules / "rules_test.yml").write_text("rule_files: [rules.yml]\ntests: []\n")
    boards = tmp_path / "deploy" / "grafana" / "dashboards"
    boards.mkdir(parents=True)
    (boards / "a.json").write_text("{}\n")
    assert len(sync_chart_files.drift(tmp_path)) == 2
    assert len(sync_chart_files.sync(tmp_path)) == 2
    assert sync_chart_files.drift(tmp_path) == []
    copies = tmp_path / "helm" / "retrieval-monitor" / "files"
    assert not (copies / "rules" / "rules_test.yml").exists()  # a promtool test, not rules
    (boards / "a.json").write_text('{"title": "changed"}\n')
    (copies / "rules" / "old.yml").write_text("groups: []\n")
    assert sorted(line.split(":")[0] for line in sync_chart_files.drift(tmp_path)) == [
        "differs",
        "no source",
    ]


def scraped_job_names() -> set[str]:
    text = "\n".join((REPO_ROOT / p).read_text() for p in sync_chart_files.rule_files(REPO_ROOT))
    return set(re.findall(r'job="([^"]+)"', text))


def test_service_monitor_scrapes_metrics_under_the_job_the_rules_select(
    rendered: dict[str, list[Manifest]],
) -> None:
    monitor = only(rendered["full"], "ServiceMonitor")
    service = only(rendered["full"], "Service")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] in {r.path for r in scrape_router.routes}  # type: ignore[attr-defined]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    job = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert [r["replacement"] for r in job] == sorted(scraped_job_names())
    assert endpoint["authorization"]["credentials"] == {
        "name": "retrieval-monitor-scrape-key",
        "key": "api-key",
    }


def test_probes_point_at_real_endpoints(rendered: dict[str, list[Manifest]]) -> None:
    routes = {r.path for r in health_router.routes}  # type: ignore[attr-defined]
    for scenario, manifests in rendered.items():
        api = container(only(manifests, "Deployment", "api"))
        ports = {p["name"]: p["containerPort"] for p in api["ports"]}
        listen = int(api["args"][api["args"].index("--port") + 1])
        assert ports == {"http": listen}, scenario
        assert api["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert {"/healthz", "/readyz"} <= routes
        assert "--no-worker" in api["args"]


def test_worker_and_scheduler_probes_check_the_real_process(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    manifests = rendered["minimal"]
    worker = container(only(manifests, "Deployment", "worker"))
    ping = worker["livenessProbe"]["exec"]["command"][-1]
    words = shlex.split(ping)
    assert words[words.index("-A") + 1] == "workers.celery_app"
    assert importlib.util.find_spec("workers.celery_app") is not None
    assert "ping" in words
    assert words[0] == "exec"
    assert worker["args"][0] == "worker"
    scheduler = container(only(manifests, "Deployment", "scheduler"))
    assert scheduler["args"] == ["scheduler"]
    check = shlex.split(scheduler["livenessProbe"]["exec"]["command"][-1])
    folder, pattern = check[1], check[check.index("-name") + 1]
    assert folder == DATA_DIR
    # The schedule file the CLI gives celery beat, under the same data folder.
    command = worker_command(1, True, Settings(data_dir=str(tmp_path)))
    schedule = Path(command[command.index("--schedule") + 1])
    assert schedule.parent == tmp_path
    assert fnmatch.fnmatch(schedule.name, pattern)
    assert fnmatch.fnmatch(schedule.name + ".dat", pattern)  # dbm.dumb's file names


def test_secrets_never_reach_a_configmap_or_a_plain_env_value(
    rendered: dict[str, list[Manifest]],
) -> None:
    full = ci_values("full")
    secrets = [
        full["judge"]["apiKey"],
        "ci-database-password",
        "ci-redis-password",
        "ci-broker-password",
        full["externalDatabase"]["url"],
    ]
    for scenario, manifests in rendered.items():
        for manifest in manifests:
            if manifest["kind"] == "Secret":
                continue
            text = json.dumps(manifest)
            leaked = [s for s in secrets if s in text]
            assert leaked == [], f"{scenario}: {manifest['kind']} {manifest['metadata']['name']}"
            if manifest["kind"] == "ConfigMap":
                assert not {*SECRET_SETTINGS, BROKER_SETTING} & set(manifest.get("data", {}))
    chart_secrets = [m for m in of_kind(rendered["full"], "Secret") if not is_hook(m)]
    assert len(chart_secrets) == 1
    assert chart_secrets[0]["stringData"]["RM_JUDGE_API_KEY"] == full["judge"]["apiKey"]


def test_an_existing_secret_replaces_the_charts_own(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["existing-secret"]
    values = ci_values("existing-secret")["existingSecret"]
    assert of_kind(manifests, "Secret") == []
    wanted = {
        "RM_DATABASE_URL": values["keys"]["databaseUrl"],
        "RM_REDIS_URL": values["keys"]["redisUrl"],
        "RM_JUDGE_API_KEY": values["keys"]["judgeApiKey"],
    }
    seen = set()
    for workload in [*of_kind(manifests, "Deployment"), *of_kind(manifests, "Job")]:
        for entry in container(workload).get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == values["name"]
                assert ref["key"] == wanted[entry["name"]]
                seen.add(entry["name"])
    assert seen == set(wanted)


def test_each_workload_gets_only_the_secrets_it_uses(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["minimal"]
    assert env_names(only(manifests, "Deployment", "api")) == ["RM_DATABASE_URL", "RM_REDIS_URL"]
    assert env_names(only(manifests, "Deployment", "worker")) == list(SECRET_SETTINGS)
    assert env_names(only(manifests, "Deployment", "scheduler")) == ["RM_REDIS_URL"]
    job = only(manifests, "Job")
    assert "RM_DATABASE_URL" in env_names(job)
    assert not {"RM_REDIS_URL", "RM_JUDGE_API_KEY"} & set(env_names(job))


def test_a_broker_of_its_own_reaches_every_process_that_queues_or_judges(
    rendered: dict[str, list[Manifest]],
) -> None:
    """externalBroker.url goes into the chart's Secret and, from it, to the API, the workers and
    the scheduler (never to the migration job); without it no process gets RM_BROKER_URL."""
    manifests = rendered["rabbitmq"]
    (secret,) = [m for m in of_kind(manifests, "Secret") if not is_hook(m)]
    assert secret["stringData"][BROKER_SETTING] == ci_values("rabbitmq")["externalBroker"]["url"]
    for component in ("api", "worker", "scheduler"):
        (entry,) = [
            e
            for e in container(only(manifests, "Deployment", component))["env"]
            if e["name"] == BROKER_SETTING
        ]
        assert entry["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": BROKER_SETTING,
        }
    assert BROKER_SETTING not in env_names(only(manifests, "Job"))
    for scenario in ("minimal", "full", "existing-secret"):
        for workload in [
            *of_kind(rendered[scenario], "Deployment"),
            *of_kind(rendered[scenario], "Job"),
        ]:
            assert BROKER_SETTING not in env_names(workload), scenario


def test_keda_reads_the_rabbitmq_queue_when_the_queue_is_there(
    rendered: dict[str, list[Manifest]], chart: helm.Chart
) -> None:
    manifests = rendered["rabbitmq"]
    values = ci_values("rabbitmq")
    (trigger,) = only(manifests, "ScaledObject")["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"] == {
        "protocol": "amqp",
        "queueName": values["config"]["RM_QUEUE_NAME"],
        "mode": "QueueLength",
        "value": str(values["worker"]["keda"]["listLength"]),
    }
    auth = only(manifests, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    (secret,) = [m for m in of_kind(manifests, "Secret") if not is_hook(m)]
    # KEDA reads the broker's address, password included, from the chart's Secret.
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "host", "name": secret["metadata"]["name"], "key": BROKER_SETTING}
    ]
    without_broker = {**values, "externalBroker": {"url": ""}}
    with pytest.raises(helm.HelmRenderError, match="reads the broker URL from the Secret"):
        render(chart, without_broker)


def test_config_settings_are_real_settings(rendered: dict[str, list[Manifest]]) -> None:
    known = {f"RM_{name.upper()}" for name in Settings.model_fields}
    for manifests in rendered.values():
        config = [
            m
            for m in of_kind(manifests, "ConfigMap")
            if "grafana_dashboard" not in m["metadata"]["labels"]
        ]
        assert len(config) == 1
        assert set(config[0]["data"]) <= known
        assert config[0]["data"]["RM_DATA_DIR"] == DATA_DIR


def test_pods_run_unprivileged_on_a_read_only_root(rendered: dict[str, list[Manifest]]) -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    image_uid = int(re.search(r"ARG APP_UID=(\d+)", dockerfile).group(1))  # type: ignore[union-attr]
    for scenario, manifests in rendered.items():
        for workload in [*of_kind(manifests, "Deployment"), *of_kind(manifests, "Job")]:
            where = f"{scenario}: {workload['metadata']['name']}"
            pod = pod_spec(workload)
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] == image_uid, where
            assert pod["automountServiceAccountToken"] is False, where
            box = container(workload)
            assert box["securityContext"]["readOnlyRootFilesystem"] is True, where
            assert box["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert box["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["mountPath"]: volumes[m["name"]] for m in box["volumeMounts"]}
            assert set(mounts) == {DATA_DIR, "/tmp"}, where
            assert all("emptyDir" in v for v in mounts.values()), where


def test_labels_and_selectors_agree(rendered: dict[str, list[Manifest]]) -> None:
    required = {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/part-of",
        "helm.sh/chart",
    }
    for manifests in rendered.values():
        for manifest in manifests:
            assert required <= set(manifest["metadata"]["labels"]), manifest["metadata"]["name"]
        pods = {}
        for deployment in of_kind(manifests, "Deployment"):
            template_labels = deployment["spec"]["template"]["metadata"]["labels"]
            selector = deployment["spec"]["selector"]["matchLabels"]
            assert selector.items() <= template_labels.items()
            pods[deployment["metadata"]["name"]] = template_labels
        assert {labels["app.kubernetes.io/component"] for labels in pods.values()} == {
            "api",
            "worker",
            "scheduler",
        }
        service = only(manifests, "Service")
        chosen = [
            n for n, labels in pods.items() if service["spec"]["selector"].items() <= labels.items()
        ]
        assert chosen == [f"{RELEASE}-retrieval-monitor-api"]
        for budget in of_kind(manifests, "PodDisruptionBudget"):
            match = budget["spec"]["selector"]["matchLabels"]
            assert len([n for n, labels in pods.items() if match.items() <= labels.items()]) == 1


def test_worker_scaling_follows_the_values(rendered: dict[str, list[Manifest]]) -> None:
    worker_name = f"{RELEASE}-retrieval-monitor-worker"
    minimal = rendered["minimal"]
    assert only(minimal, "Deployment", "worker")["spec"]["replicas"] == 2
    assert of_kind(minimal, "HorizontalPodAutoscaler") == of_kind(minimal, "ScaledObject") == []

    by_cpu = rendered["existing-secret"]
    assert "replicas" not in only(by_cpu, "Deployment", "worker")["spec"]
    hpa = only(by_cpu, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": worker_name,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)

    by_queue = rendered["full"]
    assert "replicas" not in only(by_queue, "Deployment", "worker")["spec"]
    assert of_kind(by_queue, "HorizontalPodAutoscaler") == []
    scaled = only(by_queue, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {"name": worker_name}
    (trigger,) = scaled["spec"]["triggers"]
    full = ci_values("full")
    # Celery keeps a queue's tasks in a Redis list named after the queue.
    assert trigger["metadata"]["listName"] == full["config"]["RM_QUEUE_NAME"]
    assert trigger["metadata"]["databaseIndex"] == full["externalRedis"]["url"].rsplit("/", 1)[1]
    auth = only(by_queue, "TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


def test_both_worker_autoscalers_at_once_are_refused(chart: helm.Chart) -> None:
    values = ci_values("minimal")
    values["worker"] = {
        "autoscaling": {"enabled": True},
        "keda": {"enabled": True, "redisAddress": "redis:6379"},
    }
    with pytest.raises(helm.HelmRenderError, match="enable one of them"):
        render(chart, values)


def test_scheduler_is_a_single_replica_never_doubled(rendered: dict[str, list[Manifest]]) -> None:
    for manifests in rendered.values():
        scheduler = only(manifests, "Deployment", "scheduler")
        assert scheduler["spec"]["replicas"] == 1
        assert scheduler["spec"]["strategy"] == {"type": "Recreate"}


def test_workloads_have_separate_resources_and_shutdown_time(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["minimal"]
    api = only(manifests, "Deployment", "api")
    worker = only(manifests, "Deployment", "worker")
    assert container(api)["resources"] != container(worker)["resources"]
    # The worker must outlive its longest judge call; the API its drain plus the preStop pause.
    assert pod_spec(worker)["terminationGracePeriodSeconds"] >= Settings().judge_timeout_seconds
    pause = int(container(api)["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod_spec(api)["terminationGracePeriodSeconds"] >= pause + 10


def test_migrations_run_as_a_hook_before_the_pods(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["minimal"]
    job = only(manifests, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert container(job)["args"] == ["migrate"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    # The hook runs before the release's Secret exists: it brings its own, created first.
    (hook_secret,) = [m for m in of_kind(manifests, "Secret") if is_hook(m)]
    hook = hook_secret["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(hook["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    (database,) = [e for e in container(job)["env"] if e["name"] == "RM_DATABASE_URL"]
    assert database["valueFrom"]["secretKeyRef"]["name"] == hook_secret["metadata"]["name"]
    assert "serviceAccountName" not in pod_spec(job)


def test_subcharts_wire_their_generated_passwords_into_the_urls(chart: helm.Chart) -> None:
    manifests = render(chart, {"postgresql": {"enabled": True}, "redis": {"enabled": True}})
    api = only(manifests, "Deployment", "api")
    env = container(api)["env"]
    names = [e["name"] for e in env]
    urls = {e["name"]: e.get("value", "") for e in env}
    # Kubernetes expands $(VAR) only from variables defined earlier in the list.
    assert names.index("RM_POSTGRES_PASSWORD") < names.index("RM_DATABASE_URL")
    assert names.index("RM_REDIS_PASSWORD") < names.index("RM_REDIS_URL")
    assert urls["RM_DATABASE_URL"] == (
        f"postgresql+psycopg://retrieval_monitor:$(RM_POSTGRES_PASSWORD)@{RELEASE}-postgresql:5432/retrieval_monitor"
    )
    assert urls["RM_REDIS_URL"] == f"redis://:$(RM_REDIS_PASSWORD)@{RELEASE}-redis-master:6379/0"
    job = only(manifests, "Job")
    # The subchart's database exists only after the install, so the first migration follows it.
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"


def test_ingress_exposes_only_the_event_api_by_default(rendered: dict[str, list[Manifest]]) -> None:
    ingress = only(rendered["full"], "Ingress")
    paths = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert [p["path"] for p in paths] == ["/v1"]
    assert {p["backend"]["service"]["name"] for p in paths} == {
        only(rendered["full"], "Service")["metadata"]["name"]
    }


def test_notes_tell_where_to_send_events(chart: helm.Chart) -> None:
    notes = render_files(chart, ci_values("minimal"))["retrieval-monitor/templates/NOTES.txt"]
    assert f"http://{RELEASE}-retrieval-monitor.{NAMESPACE}.svc:8080/v1/events" in notes
