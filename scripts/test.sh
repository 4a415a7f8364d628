#!/usr/bin/env bash
# The project's test command: install everything into a virtualenv, then lint, type-check and run
# the test suite against real servers (tansu, SecantusDB, RabbitMQ; see msgbus/services.py).
#
#   bash scripts/test.sh [pytest args]     e.g. bash scripts/test.sh -k services
#
# Environment: VENV (default .venv in the repo), PYTHON (default python3, 3.11 or newer),
# CI=true (set by .ci/run) makes a server that cannot start fail the tests instead of skipping them.
# RabbitMQ is installed (apt-get, as root) and started if needed; the other servers are started by
# the tests on free ports and stopped at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
STARTED_AT=$SECONDS

step() { printf '\n==> [%3ds] %s\n' "$((SECONDS - STARTED_AT))" "$*"; }

apt_install() {
    if [ "$(id -u)" != 0 ]; then
        echo "error: $* missing; install it (as root: apt-get install $*)" >&2
        exit 1
    fi
    if ! apt-cache show "$@" >/dev/null 2>&1; then  # unknown to apt: the lists are empty or stale
        step "apt-get update"
        apt-get update
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

make_venv() {
    if [ -x "$VENV/bin/python" ]; then
        step "reusing virtualenv $VENV"
        return
    fi
    step "creating virtualenv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { echo "error: Python 3.11 or newer needed; set PYTHON=..." >&2; exit 1; }
    if ! "$PYTHON" -m venv "$VENV"; then
        rm -rf "$VENV"
        step "installing python3-venv (Debian's python3 ships without ensurepip)"
        apt_install python3-venv
        "$PYTHON" -m venv "$VENV"
    fi
}

install_project() {
    local packages=(-e '.[dev,services]')
    if [ -f client/pyproject.toml ] || [ -f client/setup.py ]; then
        packages=(-e ./client "${packages[@]}")
    else
        echo "warning: client/ has no pyproject.toml yet; not installing the client" >&2
    fi
    step "pip install ${packages[*]}"
    "$VENV/bin/python" -m pip install --disable-pip-version-check "${packages[@]}"
}

ensure_rabbitmq() {
    step "RabbitMQ on 127.0.0.1:5672 (installed and started if needed)"
    "$VENV/bin/python" -c 'from msgbus.services import ensure_rabbitmq; print(ensure_rabbitmq())'
}

make_venv
install_project
ensure_rabbitmq
step "ruff check ."
"$VENV/bin/ruff" check .
step "mypy"
"$VENV/bin/mypy"
step "pytest (CI=${CI:-unset})"
"$VENV/bin/python" -m pytest -q -x --durations=15 "$@"
step "all checks passed"
