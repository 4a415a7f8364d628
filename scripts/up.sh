#!/usr/bin/env bash
# Set up a fresh machine and run the whole bus on embedded defaults, with a demo subscriber:
#
#   bash scripts/up.sh [msgbus up options]      then, elsewhere: .venv/bin/msgbus send demo '{"hello": 1}'
#
# No servers to install by hand: MongoDB is an embedded SecantusDB child process (data in .msgbus/),
# and destinations use the direct path unless MSGBUS_KAFKA_BOOTSTRAP / MSGBUS_RABBITMQ_URL are set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/lib.sh

make_venv
install_project
step "msgbus up --demo $*"
exec "$VENV/bin/msgbus" up --demo "$@"
