"""The house's layers: the shared core (`msgbus`) imports no service, the services never import
each other, only the composition root (`msgbus_cli`) imports them all, and every MongoDB read
and write is in the store (`msgbus/store`)."""

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


# The store's own modules: every MongoDB read and write of the product is in them.
STORE = "msgbus/store"
PRODUCT = ("msgbus", *SERVICES, COMPOSITION_ROOT)
# what a module outside the store may take from pymongo: its exceptions (an outage's handling)
PYMONGO_OUTSIDE_THE_STORE = {"pymongo.errors"}


def outside_the_store() -> list[tuple[str, ast.Module]]:
    """(path, syntax tree) of every product module that is not one of the store's."""
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = str(path.relative_to(ROOT))
            if not module.startswith(f"{STORE}/"):
                found.append((module, ast.parse(path.read_text(), filename=str(path))))
    return found


def imported_modules(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_module_outside_the_store_uses_pymongo_but_for_its_exceptions() -> None:
    drivers = ("pymongo", "bson", "motor")
    found = {module: {name for name in imported_modules(tree) if name.split(".")[0] in drivers}
             for module, tree in outside_the_store()}
    assert {module: names - PYMONGO_OUTSIDE_THE_STORE for module, names in found.items()
            if names - PYMONGO_OUTSIDE_THE_STORE} == {}


def test_no_module_outside_the_store_reaches_a_collection() -> None:
    """Neither the database (`MongoStore.db`) nor the store's helpers that take a collection
    (`msgbus.store.idsets`): a query outside the store has no way to its collection."""
    found = {module: sorted({f".db (line {node.lineno})" for node in ast.walk(tree)
                             if isinstance(node, ast.Attribute) and node.attr == "db"}
                            | ({"msgbus.store.idsets"} & imported_modules(tree)))
             for module, tree in outside_the_store()}
    assert {module: names for module, names in found.items() if names} == {}
