"""One definition per name: no package module spells a contract metric, tag or state value,
and no class, type alias or constant is defined by two modules.

Every string constant of ``objectives/``, ``workers/``, ``sweeps/`` and ``service/`` is read
with ``ast`` (docstrings and the messages of logging/print calls excluded); one equal to a
metric name of :mod:`workers.contract`, a tag (a module-level ``*_TAG`` constant of any
package module) or a state of the state enums fails the test outside the value's home (the
module that defines it) unless ``tests/name_scan_allowlist.txt`` lists that value for that
file, with the reason. The module-level classes, type aliases and constants of those packages
and ``ksweep/`` are read the same way: a name two modules define fails (import it from its home),
and so does a private name (``_name``) one module imports from another, and a private attribute
one module reads on another's object (``x._name``, x not ``self`` or ``cls``), torch's and the
other names of :data:`ALLOWED_PRIVATE` aside.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

from sweeps.status import SweepState, TrialState
from workers import contract

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("objectives", "workers", "sweeps", "service", "ksweep")
DEFINING_PACKAGES = (*PACKAGES, "ksweep")
# Python 3.12's `type X = ...` (none on 3.11, where `X: TypeAlias = ...` is an annotated assignment).
TYPE_STATEMENT = getattr(ast, "TypeAlias", ())
MIGRATIONS = "service/store/migrations"  # frozen history: each revision names its own constants
CONTRACT = "workers/contract.py"
STATE_ENUMS = (contract.TrainingStatus, SweepState, TrialState)
ALLOWLIST = Path(__file__).with_name("name_scan_allowlist.txt")
MESSAGE_CALLS = {"debug", "info", "warning", "error", "exception", "critical", "print", "echo"}


def package_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def _relative(path: Path | str) -> str:
    return str(Path(path).resolve().relative_to(ROOT))


def defined_tags() -> dict[str, tuple[str, str]]:
    """Each module-level ``*_TAG = "..."`` of the packages: value -> (name, defining file).

    A tag value defined by two modules fails: a name has one home.
    """
    tags: dict[str, tuple[str, str]] = {}
    for path in package_files():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if (isinstance(target, ast.Name) and target.id.endswith("_TAG")
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                home = _relative(path)
                assert tags.get(value.value, (None, home))[1] == home, (
                    f"{value.value!r} is defined as a tag in {tags[value.value][1]} and {home}")
                tags[value.value] = (target.id, home)
    return tags


def contract_values() -> dict[str, tuple[str, set[str]]]:
    """Each metric, tag and state value: value -> (the name that defines it, its home files).

    A state word shared by two enums (``running``) has both modules as homes."""
    values: dict[str, tuple[str, set[str]]] = {
        value: (name, {home}) for value, (name, home) in defined_tags().items()}
    for name, value in vars(contract).items():
        if not name.startswith("_") and isinstance(value, str) and "/" in value:
            values.setdefault(value, (name, {CONTRACT}))
        elif name in ("METRIC_NAMES", "HISTORY_METRICS"):
            values.update({metric: (name, {CONTRACT}) for metric in value if metric not in values})
    for enum in STATE_ENUMS:
        home = _relative(inspect.getfile(enum))
        for state in enum:
            values.setdefault(state.value, (enum.__name__, set()))[1].add(home)
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


def spelled(path: Path, values: dict[str, tuple[str, set[str]]]) -> set[str]:
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
    for path in package_files():
        relative = _relative(path)
        names = {value for value in spelled(path, values) if relative not in values[value][1]}
        if names:
            found[relative] = names
    new = {path: sorted(names - allowed.get(path, set()))
           for path, names in found.items() if names - allowed.get(path, set())}
    assert not new, "import these from their home instead of spelling them: " + "; ".join(
        f"{path}: {', '.join(f'{v!r} ({values[v][0]}, {sorted(values[v][1])})' for v in names)}"
        for path, names in new.items())
    stale = {path: sorted(names - found.get(path, set()))
             for path, names in allowed.items() if names - found.get(path, set())}
    assert not stale, f"allowlist entries no longer needed (remove them): {stale}"


def test_each_value_has_its_home() -> None:
    values = contract_values()
    assert values["ksweep.state"] == ("STATE_TAG", {"sweeps/status.py"})
    assert values["ksweep.cohort"] == ("COHORT_TAG", {"sweeps/tune/member_runs.py"})
    assert values["val/loss"][1] == {CONTRACT}
    assert values["finished"] == ("TrainingStatus", {CONTRACT})
    assert values["running"][1] == {CONTRACT, "sweeps/status.py"}
    assert values["queued"] == ("SweepState", {"sweeps/status.py"})


def test_the_scan_sees_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Docstring: running."""\nimport logging\n'
                      'STATE = "running"\nTAG = "ksweep.state"\nlogging.info("failed")\n'
                      'def f():\n    """queued"""\n    return "val/loss"\n')
    assert spelled(module, contract_values()) == {"running", "ksweep.state", "val/loss"}


def _is_type_variable(value: ast.expr | None) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    return isinstance(func, ast.Name | ast.Attribute) and (
        getattr(func, "id", None) or getattr(func, "attr", None)) in ("TypeVar", "ParamSpec")


def defined_names(path: Path) -> set[str]:
    """The classes, type aliases and constants (a name starting with a capital) ``path`` defines
    at module level; type variables (``T = TypeVar("T")``) are local to their module."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, TYPE_STATEMENT):
            names.add(node.name.id)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and not _is_type_variable(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets
                         if isinstance(target, ast.Name) and target.id[:1].isupper())
    return names


def definitions() -> dict[str, set[str]]:
    """Name -> the package modules that define it (see :func:`defined_names`)."""
    homes: dict[str, set[str]] = {}
    for path in (path for package in DEFINING_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))):
        relative = _relative(path)
        if not relative.startswith(MIGRATIONS):
            for name in defined_names(path):
                homes.setdefault(name, set()).add(relative)
    return homes


def test_each_class_alias_and_constant_has_one_definition() -> None:
    twice = {name: sorted(homes) for name, homes in definitions().items() if len(homes) > 1}
    assert not twice, "defined by more than one module (keep one, import it elsewhere; a name " \
        f"that means another thing gets another name): {twice}"


def test_the_definition_scan_sees_classes_aliases_and_constants(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('from typing import TypeAlias, TypeVar\nT = TypeVar("T")\nLIMIT = 3\n'
                      'Rows = list[int]\nCells: TypeAlias = dict[str, int]\nWIDTH: int = 4\nlog = None\n'
                      'class Shape:\n    SIDES = 4\ndef helper():\n    INNER = 1\n')
    assert defined_names(module) == {"LIMIT", "Rows", "Cells", "WIDTH", "Shape"}


# Private names of other projects this one reads on purpose, each with its reason.
ALLOWED_PRIVATE = {
    "torch._dynamo": "torch._dynamo.reset(): a new compiled cohort starts dynamo's code cache afresh",
    "os._exit": "a writer process whose parent died exits without running the parent's hooks",
    "ray._private": "the local Ray's node handle, to stop its autoscaler monitor first at the end",
}
# Private imports across modules still to be made public (none now: keep it empty).
PENDING_PRIVATE_IMPORTS: dict[str, set[str]] = {}


def _module_name(path: Path) -> str:
    parts = Path(_relative(path)).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_imports(path: Path) -> set[str]:
    """``module.name`` for each private name (``_name``) ``path`` imports from another module of
    the project (relative imports resolved)."""
    own = _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        if module.split(".")[0] not in DEFINING_PACKAGES or module == own:
            continue
        found.update(f"{module}.{alias.name}" for alias in node.names
                     if alias.name.startswith("_") and not alias.name.startswith("__"))
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    crossing = {_relative(path): names for package in DEFINING_PACKAGES
                for path in sorted((ROOT / package).rglob("*.py")) if (names := private_imports(path))}
    unexpected = {path: sorted(names - PENDING_PRIVATE_IMPORTS.get(path, set()))
                  for path, names in crossing.items() if names - PENDING_PRIVATE_IMPORTS.get(path, set())}
    assert not unexpected, f"make these public, or move the user beside them: {unexpected}"
    stale = {path: sorted(names - crossing.get(path, set()))
             for path, names in PENDING_PRIVATE_IMPORTS.items() if names - crossing.get(path, set())}
    assert not stale, f"no longer imported: take them off PENDING_PRIVATE_IMPORTS: {stale}"


def test_the_private_import_scan_sees_a_crossing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for folder in ("workers/tracking", "ksweep/cli"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "ksweep/cli/a.py").write_text("from workers.tracking.writer import _THREAD, log\n")
    (tmp_path / "workers/tracking/b.py").write_text("from workers.tracking.writer import _THREAD\n"
                                                     "from .runs import _chunks, RunLogger\n")
    (tmp_path / "workers/tracking/writer.py").write_text("from workers.tracking.writer import _own\n")
    assert private_imports(tmp_path / "ksweep/cli/a.py") == {"workers.tracking.writer._THREAD"}
    assert private_imports(tmp_path / "workers/tracking/b.py") == {
        "workers.tracking.writer._THREAD", "workers.tracking.runs._chunks"}
    assert private_imports(tmp_path / "workers/tracking/writer.py") == set()


def _defined_private(tree: ast.AST) -> set[str]:
    """The private attributes a module's own classes define: their methods and fields, and what
    they assign (``self._x = ...``, ``trainer._x = ...`` in a classmethod, ``setattr``)."""
    names: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "setattr" and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                names.add(str(node.args[1].value))
    return {name for name in names if name.startswith("_")}


def private_attribute_reads(path: Path) -> set[str]:
    """``line: expression`` for each private attribute (``x._name``, not a dunder) ``path`` reads
    on something other than ``self`` or ``cls`` that the module does not define itself (so it is
    another module's), less :data:`ALLOWED_PRIVATE`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _defined_private(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")) or node.attr in own:
            continue
        if isinstance(node.value, ast.Name) and (
                node.value.id in ("self", "cls") or f"{node.value.id}.{node.attr}" in ALLOWED_PRIVATE):
            continue
        found.add(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_attributes() -> None:
    reads = {_relative(path): sorted(found) for package in DEFINING_PACKAGES
             for path in sorted((ROOT / package).rglob("*.py")) if (found := private_attribute_reads(path))}
    assert not reads, f"give the owner a public name for these: {reads}"


def test_the_private_attribute_scan_sees_a_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os, torch\n"
                      "class Own:\n    def __init__(self):\n        self._mine = 1\n"
                      "def use(other, own: Own, cohort):\n"
                      "    torch._dynamo.reset()\n    os._exit(0)\n"
                      "    return own._mine + other.__dict__ + cohort._data + cohort.rows[0]._stacks()\n")
    assert private_attribute_reads(module) == {"8: cohort._data", "8: cohort.rows[0]._stacks"}
