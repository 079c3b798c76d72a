"""One definition per name: no package module spells a contract metric, tag or state value.

Every string constant of ``objectives/``, ``workers/``, ``sweeps/`` and ``service/`` is read
with ``ast`` (docstrings and the messages of logging/print calls excluded); one equal to a
metric name, a tag or a sweep/trial state of :mod:`workers.contract` fails the test unless
``tests/name_scan_allowlist.txt`` lists that value for that file, with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workers import contract

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("objectives", "workers", "sweeps", "service")
HOME = ROOT / "workers" / "contract.py"
ALLOWLIST = Path(__file__).with_name("name_scan_allowlist.txt")
MESSAGE_CALLS = {"debug", "info", "warning", "error", "exception", "critical", "print", "echo"}


def contract_values() -> dict[str, str]:
    """Each metric, tag and state value of the contract, with the name that defines it."""
    values: dict[str, str] = {}
    for name, value in vars(contract).items():
        if name.startswith("_"):
            continue
        if isinstance(value, str) and (name.endswith("_TAG") or "/" in value):
            values.setdefault(value, name)
        elif name in ("METRIC_NAMES", "HISTORY_METRICS"):
            values.update({metric: name for metric in value if metric not in values})
    for enum in (contract.SweepState, contract.TrialState):
        values.update({s.value: enum.__name__ for s in enum if s.value not in values})
    return values


def _excluded(tree: ast.AST) -> set[int]:
    """Docstrings, and every constant inside a logging or print call."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in MESSAGE_CALLS:
                skip.update(id(inner) for inner in ast.walk(node) if isinstance(inner, ast.Constant))
    return skip


def spelled(path: Path, values: dict[str, str]) -> set[str]:
    """The contract values that ``path`` spells as string constants."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _excluded(tree)
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in values and id(node) not in skip}


def allowlist() -> dict[str, set[str]]:
    """``path: value value ...  # why`` lines; every entry must give its reason."""
    allowed: dict[str, set[str]] = {}
    for number, line in enumerate(ALLOWLIST.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        entry, hash_, why = line.partition("#")
        path, colon, names = entry.partition(":")
        assert colon and hash_ and why.strip(), f"{ALLOWLIST.name}:{number}: want 'path: values  # why'"
        allowed.setdefault(path.strip(), set()).update(names.split())
    return allowed


def test_no_module_spells_a_contract_name_outside_its_home() -> None:
    values, allowed = contract_values(), allowlist()
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != HOME:
                names = spelled(path, values)
                if names:
                    found[str(path.relative_to(ROOT))] = names
    new = {path: sorted(names - allowed.get(path, set()))
           for path, names in found.items() if names - allowed.get(path, set())}
    assert not new, "import these from workers.contract instead of spelling them: " + "; ".join(
        f"{path}: {', '.join(f'{v!r} ({values[v]})' for v in names)}" for path, names in new.items())
    stale = {path: sorted(names - found.get(path, set()))
             for path, names in allowed.items() if names - found.get(path, set())}
    assert not stale, f"allowlist entries no longer needed (remove them): {stale}"


def test_the_scan_sees_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Docstring: running."""\nimport logging\n'
                      'STATE = "running"\nTAG = "ksweep.state"\nlogging.info("failed")\n'
                      'def f():\n    """queued"""\n    return "val/loss"\n')
    assert spelled(module, contract_values()) == {"running", "ksweep.state", "val/loss"}
