"""The documentation site: it builds with ``--strict``, renders offline, and its reference pages
cover every ``ksweep`` command and every REST operation.

Builds the real site (``mkdocs build --strict``, the gen-files scripts included) once per module
into a temporary folder, then reads the built HTML as a reader's browser gets it.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from ksweep.cli import app as cli_app
from service.api.app import create_app
from tests.support.groups import docs_site

pytestmark = docs_site  # the site is built once, on one worker
ROOT = Path(__file__).resolve().parents[1]
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# A <script src>, <link href> or CSS url() that leaves the site: what an offline reader lacks.
EXTERNAL_ASSET = re.compile(
    r"""<script[^>]+src=["'](?:https?:)?//|<link[^>]+href=["'](?:https?:)?//[^"']*["'][^>]*rel=["']stylesheet"""
    r"""|<link[^>]+rel=["']stylesheet["'][^>]+href=["'](?:https?:)?//|url\(["']?(?:https?:)?//""",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built by ``mkdocs build --strict``; a warning fails the build and so the test."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page_text(site: Path, page: str) -> str:
    """The visible text of a built page (tags dropped, entities decoded, spaces collapsed)."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", " ", raw))
    return re.sub(r"\s+", " ", text)


def cli_commands(group: Any, prefix: str) -> dict[str, Any]:
    """Every command of a Typer group by path, nested groups included (``ksweep sweep run``).

    Typer vendors its own click, so groups are told by their ``commands`` mapping.
    """
    found: dict[str, Any] = {}
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        found[path] = command
        if getattr(command, "commands", None) is not None:
            found.update(cli_commands(command, path))
    return found


def test_every_cli_command_is_in_the_cli_reference(site: Path) -> None:
    commands = cli_commands(typer.main.get_command(cli_app), "ksweep")
    assert {"ksweep submit", "ksweep sweep run", "ksweep serve"} <= set(commands)
    text = page_text(site, "reference/cli")
    missing = [c for c in commands if f"$ {c} [" not in text]  # its usage line
    assert not missing, f"commands absent from reference/cli: {missing}"
    # Every option of every command is listed too (a renamed flag shows up here).
    for path, command in commands.items():
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("--"):
                    assert opt in text, f"{path}: option {opt} absent from reference/cli"


def test_every_rest_operation_is_in_the_rest_reference(site: Path) -> None:
    document = create_app().openapi()
    operations = [f"{method.upper()} {path}" for path, item in document["paths"].items()
                  for method in item if method in HTTP_METHODS]
    assert "POST /api/v1/sweeps" in operations and len(operations) >= 9
    text = page_text(site, "reference/rest")
    missing = [op for op in operations if op not in text]
    assert not missing, f"operations absent from reference/rest: {missing}"


def test_every_example_spec_and_top_level_field_is_in_the_spec_reference(site: Path) -> None:
    from sweeps.spec import SweepSpec

    text = page_text(site, "reference/sweep-spec")
    examples = sorted((ROOT / "sweeps" / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    for path in examples:
        assert f"sweeps/examples/{path.name}" in text
        first_line = path.read_text().strip().splitlines()[0]
        assert re.sub(r"\s+", " ", first_line) in text, f"{path.name} is not shown verbatim"
    for field in SweepSpec.model_fields:
        assert field in text, f"spec field {field} absent from reference/sweep-spec"


def test_the_site_loads_nothing_from_outside_and_typesets_math(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 10
    for page in pages:
        raw = page.read_text(encoding="utf-8")
        assert not EXTERNAL_ASSET.search(raw), f"{page.relative_to(site)} loads an asset from outside"
        assert "fonts.googleapis" not in raw and "cdn.jsdelivr" not in raw
    for asset in ("assets/katex/katex.min.js", "assets/katex/katex.min.css",
                  "assets/katex/fonts/KaTeX_Main-Regular.woff2"):
        assert (site / asset).is_file(), asset
    concepts = (site / "concepts/objectives/index.html").read_text(encoding="utf-8")
    assert concepts.count('class="arithmatex"') >= 10
    assert "assets/katex/katex.min.js" in concepts


def test_nothing_points_outside_the_repository() -> None:
    pattern = r"\.\./shared|OBJECTIVE\.md|DESIGN\.md|SCIENCE\.md"
    done = subprocess.run(["git", "grep", "-nE", pattern], cwd=ROOT, capture_output=True, text=True)
    hits = [line for line in done.stdout.splitlines() if not line.startswith("docs/")]
    outside = ".." + "/shared"  # spelled in two parts so that this file does not match itself
    hits += [line for line in done.stdout.splitlines() if line.startswith("docs/") and outside in line]
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_every_setting_is_in_the_operations_settings_table() -> None:
    """Each field of every package's settings (the service's, the client's, the sweep driver's,
    the trial worker's and the scripts') is documented by the name users set (its first alias, or KSWEEP_*)."""
    from ksweep.settings import ClientSettings
    from service.settings import Settings
    from sweeps.settings import DriverSettings
    from tests.support.scripts import load_script
    from workers.settings import WorkerSettings

    page = (ROOT / "docs" / "operations.md").read_text()
    table = page[page.index("## Settings"):]
    missing = []
    fields = [*Settings.model_fields.items(), *ClientSettings.model_fields.items(),
              *DriverSettings.model_fields.items(), *WorkerSettings.model_fields.items(),
              *load_script("script_settings.py").ScriptSettings.model_fields.items()]
    for name, field in fields:
        alias = field.validation_alias
        env = alias.choices[0] if alias is not None else f"KSWEEP_{name.upper()}"
        if f"`{env}`" not in table:
            missing.append(env)
    assert not missing, f"document these in docs/operations.md's Settings table: {missing}"


def test_the_readme_stays_short_and_its_links_resolve() -> None:
    """The README is the front page (at most 250 lines: the docs site holds the rest); it keeps
    `make test` as the test command, and each file it links exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250, "move detail to the docs site and link it"
    assert "make test" in readme
    links = re.findall(r"\]\(((?:docs|examples)/[^)#\s]+)", readme)
    assert links and [link for link in links if not (ROOT / link).exists()] == []
