#!/usr/bin/env bash
# Shared by scripts/up.sh and scripts/test.sh: a virtualenv with the project installed.
# Environment: VENV (default .venv in the repo), PYTHON (default python3, 3.11 or newer).

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
    # the client and the development tooling (`msgbus services`, `msgbus up`'s embedded
    # MongoDB, the test kit; never in the bus's wheel or image) are packages of their own
    # (`-e .` beside `-e .[extras]`: pip 24 cannot match devtools' plain `msgbus` requirement
    # to an editable given only with extras)
    local packages=(-e ./client -e ./devtools -e . -e '.[dev,analytics,otel]')
    # uv installs the same packages from PyPI about 5x faster than pip (a fresh venv: 56 s
    # against pip's 297 s on a busy 2-core machine), which is most of the suite's set-up time
    step "pip install uv; uv pip install ${packages[*]}"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv
    "$VENV/bin/uv" pip install --python "$VENV/bin/python" "${packages[@]}"
}
