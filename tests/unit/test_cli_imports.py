"""`msgbus receiver` sets up prometheus_client's multiprocess mode, which must happen before
prometheus_client is first imported: the CLI's own imports must not import it."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_cli_leaves_prometheus_client_unimported() -> None:
    probe = "import sys, msgbus_cli.main; print('prometheus_client' in sys.modules)"
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True)
    assert answer.stdout.strip() == "False", answer.stderr
