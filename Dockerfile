# syntax=docker/dockerfile:1
# One image for every msgbus service; the command picks it:
#   msgbus receiver | dispatcher | compensator | admin | node-rescuer
# Settings come from MSGBUS_* environment variables (msgbus/settings.py).
#
#   docker build -t msgbus:0.1.0 .
#   docker run --rm -e MSGBUS_MONGO_URI=mongodb://mongo:27017 -p 8080:8080 msgbus:0.1.0 receiver

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: wheels of the client, the bus and their dependencies ------------------------------
FROM ${PYTHON_IMAGE} AS build
# gcc and headers for any dependency without a wheel for this platform (lmdb, confluent-kafka
# ship manylinux wheels for amd64 and arm64; this is the fallback)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY client/ client/
COPY pyproject.toml README.md ./
COPY msgbus/ msgbus/
COPY msgbus_cli/ msgbus_cli/
COPY receiver/ receiver/
COPY dispatcher/ dispatcher/
COPY compensator/ compensator/
COPY admin/ admin/
COPY analytics/ analytics/
RUN python -m venv /opt/msgbus \
    && /opt/msgbus/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/msgbus/bin/pip install --no-cache-dir ./client ".[otel]" \
    && /opt/msgbus/bin/python -m compileall -q /opt/msgbus

# --- run: the virtual environment only, as an unprivileged user -------------------------------
FROM ${PYTHON_IMAGE} AS run
ENV PATH=/opt/msgbus/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MSGBUS_STATE_DIR=/var/lib/msgbus/state
# uid/gid 10001: the Kubernetes manifests run as this user (runAsUser, fsGroup)
RUN groupadd --system --gid 10001 msgbus \
    && useradd --system --uid 10001 --gid msgbus --home-dir /var/lib/msgbus --no-create-home msgbus \
    && mkdir -p /var/lib/msgbus/state \
    && chown -R msgbus:msgbus /var/lib/msgbus
COPY --from=build /opt/msgbus /opt/msgbus
USER 10001:10001
WORKDIR /var/lib/msgbus
EXPOSE 8080 8081 8082 8083 8085
ENTRYPOINT ["msgbus"]
CMD ["--help"]
