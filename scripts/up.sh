#!/usr/bin/env bash
# Set up a fresh machine and run the whole bus on embedded defaults, with a demo subscriber:
#
#   bash scripts/up.sh [msgbus up options]      then, elsewhere: .venv/bin/msgbus send demo '{"hello": 1}'
#
# No servers to install by hand: MongoDB is an embedded SecantusDB child process (data in .msgbus/),
# Kafka an embedded tansu child process (records in memory) unless MSGBUS_KAFKA_BOOTSTRAP is set,
# and RabbitMQ the machine's own on 127.0.0.1:5672 if it answers (or MSGBUS_RABBITMQ_URL).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/lib.sh

make_venv
install_project
step "msgbus up --demo $*"
exec "$VENV/bin/msgbus" up --demo "$@"
