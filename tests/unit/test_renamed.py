"""Names from before 0.2 keep working for one release (docs/operations.md, "Renamed in 0.2"):
the CLI's as hidden, deprecated aliases, the environment variables as second choices after the
new ones. (The client's `drain_spool`: client/tests/test_client_spooltools.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from msgbus.settings import NodeRescuerSettings, ReceiverSettings
from msgbus_cli.main import main


def test_old_command_names_run_their_command_unlisted() -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["--help"]).output
    assert "node-rescuer" in listed and "spool-drainer" not in listed
    assert "rescue" in runner.invoke(main, ["spool", "--help"]).output
    assert " drain " not in runner.invoke(main, ["spool", "--help"]).output
    renamed = [(["spool-drainer"], ["node-rescuer"]), (["spool", "drain"], ["spool", "rescue"])]
    for old, new in renamed:
        done = runner.invoke(main, [*old, "--help"])
        assert done.exit_code == 0, done.output
        assert "DEPRECATED" in done.output
        assert done.output.split("Options:")[1] == runner.invoke(
            main, [*new, "--help"]).output.split("Options:")[1]


def test_spool_drain_says_its_new_name(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["spool", "drain", str(tmp_path), "--receiver", "http://r",
                                     "--api-key", "k"])
    assert "`rescue` since 0.2" in done.stderr
    assert done.exit_code == 1 and "not a msgbus spool dir" in done.stderr  # and it ran


@pytest.mark.parametrize("flag", ["--rescue", "--drain"])
def test_orphans_rescue_and_its_old_flag(tmp_path: Path, flag: str) -> None:
    done = CliRunner().invoke(main, ["spool", "orphans", str(tmp_path), flag, "--receiver",
                                     "http://r", "--api-key", "k"])
    assert done.exit_code == 0, done.output
    assert f"0 of 0 orphaned spool(s) rescued under {tmp_path}" in done.stdout
    assert ("--drain is --rescue since 0.2" in done.stderr) == (flag == "--drain")
    assert "--drain" not in CliRunner().invoke(main, ["spool", "orphans", "--help"]).output


def test_old_receiver_variables_are_read_after_the_new_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGBUS_RECEIVER_DRAINER", "inline")
    monkeypatch.setenv("MSGBUS_RECEIVER_DRAIN_NICE", "3")
    assert (ReceiverSettings().flusher, ReceiverSettings().flush_nice) == ("inline", 3)
    monkeypatch.setenv("MSGBUS_RECEIVER_FLUSHER", "process")
    monkeypatch.setenv("MSGBUS_RECEIVER_FLUSH_NICE", "5")
    assert (ReceiverSettings().flusher, ReceiverSettings().flush_nice) == ("process", 5)
    assert ReceiverSettings(flusher="inline", flush_nice=0).flush_nice == 0  # by field name


def test_the_old_node_rescuer_prefix_is_read_after_the_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGBUS_SPOOL_DRAINER_ROOT", "/old")
    monkeypatch.setenv("MSGBUS_SPOOL_DRAINER_MIN_IDLE_S", "60")
    monkeypatch.setenv("MSGBUS_SPOOL_DRAINER_DRAIN_TIMEOUT_S", "40")
    monkeypatch.setenv("MSGBUS_SPOOL_DRAINER_API_KEY", "old-key")
    old = NodeRescuerSettings()
    assert (old.root, old.min_idle_s, old.rescue_timeout_s) == (Path("/old"), 60, 40)
    assert old.api_key.get_secret_value() == "old-key"
    monkeypatch.setenv("MSGBUS_NODE_RESCUER_ROOT", "/new")
    monkeypatch.setenv("MSGBUS_NODE_RESCUER_RESCUE_TIMEOUT_S", "30")
    new = NodeRescuerSettings()
    assert (new.root, new.min_idle_s, new.rescue_timeout_s) == (Path("/new"), 60, 30)
    assert NodeRescuerSettings(rescue_timeout_s=5).rescue_timeout_s == 5  # by field name
