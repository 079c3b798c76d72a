"""docs/layout.md names real files and real code: every path it cites exists, and every code
name it cites is defined where it says (or, said of no file, somewhere in the packages).

What it reads, whatever the page cites:
- a path in backticks (``workers/train/loop.py``, ``routes/``, ``pyproject.toml``), from the
  repository's root, else under the first folder its table row or bullet cites, else under the
  section's package (``## workers/: ...``); ``path.py:Name`` and ``path.py:123`` are checked
  for that name or line too;
- a code name in backticks inside the parentheses right after a ``.py`` path
  (``objectives/spec.py`` (``PRESETS``)), followed by `` in `` and a path, or by a path in
  parentheses: defined in that module (at its top, or as a class's member: ``Class.method``
  or the member's name alone; a dotted module path as that module);
- a ``KSWEEP_*`` variable: a field of a package's settings (``settings.py``);
- any other code-looking name (with an underscore, a capital or a dot): defined somewhere in
  the packages (a spec field's path such as ``budget.max_trials``: its last part a class's
  member), or one of the library names listed here. A file a run writes (``report.json``) is
  not a path of the repository and is left alone.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "layout.md"
PACKAGES = ("objectives", "workers", "sweeps", "service", "ksweep")
FILE_SUFFIXES = (".py", ".txt", ".toml", ".md", ".yaml", ".yml", ".cfg", ".ini")
TICK = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SECTION = re.compile(r"^## `?([a-z_]+)/`?")
RUNTIME_FILE = re.compile(r"[\w.-]+\.(json|png|db|log|csv|parquet)")
# Names the page cites from Python and its libraries, not from this repository.
LIBRARY_NAMES = {"StrEnum", "Literal", "Annotated", "ValidationError"}


def _units(text: str) -> list[tuple[str | None, str]]:
    """The page as (section package, unit): one unit per table row, bullet (with its
    continuation lines) or paragraph."""
    units: list[tuple[str | None, str]] = []
    package: str | None = None
    current: list[str] = []

    def close() -> None:
        if current:
            units.append((package, " ".join(current)))
            current.clear()

    for line in text.splitlines():
        header = SECTION.match(line)
        if line.startswith("#"):
            close()
            package = header.group(1) if header and (ROOT / header.group(1)).is_dir() else None
        elif not line.strip() or line.startswith("|") or line.startswith("- "):
            close()
            if line.startswith("|"):
                units.append((package, line))
            elif line.strip():
                current.append(line)
        else:
            current.append(line.strip())
    close()
    return units


def _is_path(token: str) -> bool:
    if " " in token or token.startswith(("/", ".")) or "*" in token or "{" in token:
        return False
    bare = token.split(":", 1)[0]
    return "/" in bare or bare.endswith(FILE_SUFFIXES)


def _resolve(token: str, base: Path | None, package: str | None) -> Path | None:
    """The file or folder a cited path names, or None."""
    bare = token.split(":", 1)[0].rstrip("/")
    direct = ROOT / bare
    if direct.exists():
        return direct
    for folder in (base, ROOT / package if package else None):
        if folder is not None and folder.is_dir():
            found = sorted(folder.rglob(bare))
            if found:
                return found[0]
    return None


@functools.cache
def _definitions(path: Path) -> frozenset[str]:
    """Top-level names of a module and ``Class.member`` for its classes' members."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        nodes = [node]
        if isinstance(node, ast.If):  # TYPE_CHECKING blocks, guarded definitions
            nodes = [*node.body, *node.orelse]
        for item in nodes:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(item.name)
            elif isinstance(item, ast.ClassDef):
                names.add(item.name)
                for member in item.body:
                    if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(f"{item.name}.{member.name}")
                    for target in targets(member):
                        names.add(f"{item.name}.{target}")
            elif isinstance(item, ast.ImportFrom | ast.Import):
                names.update((alias.asname or alias.name).split(".")[0] for alias in item.names)
            else:
                names.update(targets(item))
    return frozenset(names)


@functools.cache
def _everywhere() -> frozenset[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            names.add(module)
            names.update(n for n in _definitions(path))
            names.update(f"{module}.{n}" for n in _definitions(path))
    return frozenset(names)


def _module_file(dotted: str) -> tuple[Path, str] | None:
    """The longest module prefix of a dotted name as a file, with the rest of the name."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        stem = ROOT.joinpath(*parts[:cut])
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file() and parts[0] in PACKAGES:
                return candidate, ".".join(parts[cut:])
    return None


def _defined_in(module: Path, name: str) -> bool:
    located = _module_file(name)
    if located is not None:  # a dotted module path: that module, and what follows in it
        path, rest = located
        return not rest or rest in _definitions(path)
    names = _definitions(module)
    return name in names or ("." not in name and any(n.endswith("." + name) for n in names))


@functools.cache
def _members() -> frozenset[str]:
    """The member names of every class in the packages."""
    return frozenset(name.rsplit(".", 1)[1] for name in _everywhere() if "." in name
                     and name.split(".")[0] not in PACKAGES)


def _setting(variable: str) -> bool:
    field = variable.removeprefix("KSWEEP_").lower()
    return any(name.endswith("." + field) for package in PACKAGES
               if (ROOT / package / "settings.py").is_file()
               for name in _definitions(ROOT / package / "settings.py"))


def _defined_somewhere(name: str) -> bool:
    if name in LIBRARY_NAMES or name in _everywhere():
        return True
    if name.split(".")[0] in PACKAGES:
        return False  # a module path: exactly that module and name
    return name.rsplit(".", 1)[-1] in _members()


def _problems() -> list[str]:
    problems: list[str] = []
    for package, unit in _units(DOC.read_text()):
        base: Path | None = None
        last_module: tuple[Path, int] | None = None  # a .py path and where its citation ended
        for match in TICK.finditer(unit):
            token = match.group(1)
            if _is_path(token):
                found = _resolve(token, base, package)
                if found is None:
                    problems.append(f"no such path: `{token}` in: {unit[:120]}")
                    continue
                if base is None and found.is_dir():
                    base = found
                elif base is None:
                    base = found.parent
                detail = token.split(":", 1)[1] if ":" in token else ""
                if detail.isdigit() and int(detail) > len(found.read_text().splitlines()):
                    problems.append(f"`{token}`: the file has fewer lines")
                elif detail and not detail.isdigit() and not _defined_in(found, detail):
                    problems.append(f"`{token}`: {detail} is not defined there")
                last_module = (found, match.end()) if found.suffix == ".py" else None
                continue
            if RUNTIME_FILE.fullmatch(token) or not NAME.fullmatch(token):
                continue
            if token.startswith("KSWEEP_"):
                if not _setting(token):
                    problems.append(f"`{token}` is no field of a package's settings.py")
                continue
            code_like = "_" in token or "." in token or any(c.isupper() for c in token)
            after = unit[match.end():]
            # `name` in `path.py`; `name` (`path.py`) only for code (`serve` (`server.py`) is a command)
            follower = (re.match(r"\s+in\s+`([^`]+)`", after)
                        or (re.match(r"\s*\(`([^`]+)`\)", after) if code_like else None))
            if follower and _is_path(follower.group(1)):
                module = _resolve(follower.group(1), base, package)
                if module is not None and module.suffix == ".py" and not _defined_in(module, token):
                    problems.append(f"`{token}` is not defined in `{follower.group(1)}`")
                continue
            if last_module is not None:
                between = unit[last_module[1]:match.start()]
                inside = re.fullmatch(r"\s*\((?:[^()]*)", between)
                if inside:
                    if not _defined_in(last_module[0], token):
                        problems.append(f"`{token}` is not defined in "
                                        f"{last_module[0].relative_to(ROOT)}")
                    continue
            if code_like and not _defined_somewhere(token):
                problems.append(f"`{token}` is defined nowhere in the packages: {unit[:120]}")
    return problems


def test_every_path_and_name_the_layout_page_cites_exists():
    problems = _problems()
    assert not problems, "docs/layout.md cites what the code does not have:\n" + "\n".join(problems)


@pytest.mark.parametrize(("line", "wrong"), [
    ("| A read-out | called from `workers/train/nowhere.py` |", "no such path"),
    ("| A read-out | called from `workers/train/loop.py` (`Trainer.no_such_method`) |", "not defined in"),
    ("| `TRIAL_SUMMARY_METRICS` | `ksweep/cli/training.py` | users |", "defined nowhere"),
    ("| A name | `SUMMARY_KEYS` in `ksweep/client.py` |", "not defined in"),
])
def test_the_check_finds_a_wrong_citation(tmp_path, monkeypatch, line, wrong):
    page = tmp_path / "layout.md"
    page.write_text("# Layout\n\n| Change | Where |\n|---|---|\n" + line + "\n")
    monkeypatch.setitem(globals(), "DOC", page)
    assert any(wrong in problem for problem in _problems())
