"""The house's layers: the shared core (`msgbus`) imports no service, the services never import
each other, and only the composition root (`msgbus_cli`) imports them all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("receiver", "dispatcher", "compensator", "admin", "analytics")
COMPOSITION_ROOT = "msgbus_cli"


def imported_packages(package: str) -> dict[str, set[str]]:
    """Top-level packages each module of `package` imports, by module path."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: set[str]) -> dict[str, set[str]]:
    return {module: names & forbidden
            for module, names in imported_packages(package).items() if names & forbidden}


def test_the_core_imports_no_service_and_not_the_composition_root() -> None:
    assert offenders("msgbus", {*SERVICES, COMPOSITION_ROOT}) == {}


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    others = {*SERVICES, COMPOSITION_ROOT} - {service}
    assert offenders(service, others) == {}


def test_the_client_imports_nothing_from_the_repository() -> None:
    forbidden = {"msgbus", *SERVICES, COMPOSITION_ROOT, "msgbus_devtools"}
    assert offenders("client/msgbus_client", forbidden) == {}
