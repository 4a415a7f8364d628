#!/usr/bin/env bash
# The project's test command: install everything into a virtualenv, then lint, type-check and run
# the test suite against real servers (tansu, SecantusDB, RabbitMQ; see devtools/msgbus_devtools/servers.py).
#
#   bash scripts/test.sh [pytest args]     e.g. bash scripts/test.sh -k services
#
# Without arguments the tests run in two passes: those not marked `serial` on three pytest-xdist
# workers (they often wait on servers and timeouts: two kept the 2 cores 82 % busy and took
# 483 s, three 92 % and 423 s; an `xdist_group` keeps its tests on one worker, e.g. the Spark
# session's), then the `serial` ones (load, kill -9 and outage tests whose budgets assume a
# machine to themselves) alone. With arguments, one pass.
#
# Environment: VENV (default .venv in the repo), PYTHON (default python3, 3.11 or newer),
# CI=true (set by .ci/run) makes a server that cannot start fail the tests instead of skipping them.
# RabbitMQ and chromium are installed (apt-get, as root) and RabbitMQ started if needed; the other
# servers are started by the tests on free ports and stopped at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

. scripts/lib.sh

ensure_rabbitmq() {
    step "RabbitMQ on 127.0.0.1:5672 (installed and started if needed)"
    "$VENV/bin/python" -c 'from msgbus_devtools.servers import ensure_rabbitmq; print(ensure_rabbitmq())'
    # its management API: the broker health metrics read it (tests/integration/test_deploy_*)
    "$VENV/bin/python" -c 'from msgbus_devtools.servers import ensure_rabbitmq_management as m; print(m())'
}

ensure_chromium() {
    # the admin UI's browser tests drive Debian's chromium through Playwright
    if [ ! -x /usr/bin/chromium ]; then
        step "chromium (apt-get install chromium, for the admin UI tests)"
        apt_install chromium
    fi
}

ensure_java() {
    # the analytics jobs run on PySpark, which needs a JVM (17 or newer)
    if ! command -v java >/dev/null 2>&1; then
        step "java (apt-get install openjdk-17-jre-headless, for the analytics tests)"
        apt_install openjdk-17-jre-headless
    fi
}

ensure_test_tools() {
    # Node packages the tests use (KEDA's schemas for deploy/k8s); Node.js from Debian if absent
    if ! command -v npm >/dev/null 2>&1; then
        step "nodejs and npm (apt-get install, for tests/tools)"
        apt_install nodejs npm
    fi
    step "npm ci --prefix tests/tools"
    npm ci --prefix tests/tools --no-audit --no-fund --loglevel=error
}

QUIET_RAW_PUSHES_PER_S=14837  # bench.senders' raw loop on a quiet machine (bench/RESULTS.md, 2026-11-25)

machine_speed() {
    # The suite's time depends on how busy the shared machine is: say it, measured the same way
    # on every run, so a slow run can be told from a slower suite.
    step "machine speed: bench.senders' raw push loop for 3 s"
    "$VENV/bin/python" -m bench.senders --runs 1 --seconds 3 --targets raw | tail -n 1 |
        "$VENV/bin/python" -c "import json, sys; r = json.loads(sys.stdin.read())['raw_pushes_per_s']
print(f'{r:,.0f} pushes/s: {r / $QUIET_RAW_PUSHES_PER_S:.2f} of a quiet machine\'s')"
}

make_venv
install_project
ensure_test_tools
ensure_rabbitmq
ensure_chromium
ensure_java
step "ruff check ."
"$VENV/bin/ruff" check .
step "mypy"
"$VENV/bin/mypy"
if [ "$#" -gt 0 ]; then
    step "pytest $* (CI=${CI:-unset})"
    "$VENV/bin/python" -m pytest -q -x --durations=15 "$@"
else
    machine_speed
    tests_began=$SECONDS
    step "pytest, pass 1 of 2: the tests not marked serial, on 3 workers (CI=${CI:-unset})"
    # the waits' budgets doubled: the MongoDB stand-in stalls for 10-25 s at times under three
    # workers (docs/decisions.md, "Patience in the parallel pass")
    MSGBUS_TEST_PATIENCE="${MSGBUS_TEST_PATIENCE:-2}" \
        "$VENV/bin/python" -m pytest -q -x --durations=15 -n 3 --dist loadgroup -m "not serial"
    step "pytest, pass 2 of 2: the serial tests, alone"
    "$VENV/bin/python" -m pytest -q -x --durations=15 -m serial
    step "the tests took $((SECONDS - tests_began)) s"
fi
step "all checks passed"
