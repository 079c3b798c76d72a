"""Generate the reference pages at build time (mkdocs-gen-files), so they cannot drift.

- ``reference/sweep-spec.md``: the JSON schema of :class:`sweeps.spec.SweepSpec` as Markdown
  (jsonschema2md), then every example spec in ``sweeps/examples/`` verbatim;
- ``reference/rest.md``: the service's OpenAPI document (``create_app().openapi()``, the one
  ``/openapi.json`` serves) as Markdown (essentials-openapi; no Swagger UI, no CDN);
- ``reference/cli.md``: the ``ksweep`` Typer app, by Typer's own ``utils docs`` command.

Nothing here starts the service: ``create_app`` builds routes only; its lifespan (store,
supervisor) runs when a server starts, never here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema2md
import mkdocs_gen_files
from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "sweeps" / "examples"
# jsonschema2md links each regex to an online tester; the site links nothing outside itself.
PATTERN_TESTER = re.compile(r" \(\[Test\]\(https://regexr\.com/[^)]*\)\)")
# jsonschema2md nests lists by 2 spaces; Python-Markdown needs 4, or nested items flatten.
LIST_INDENT = re.compile(r"^( +)(?=[-*] )", re.MULTILINE)

SPEC_INTRO = """# Sweep spec reference

A sweep spec is YAML or JSON: `ksweep validate SPEC` shows its plan, `ksweep submit SPEC` and
`POST /api/v1/sweeps` run it. This page is generated from the pydantic models'
JSON schema (`SweepSpec.model_json_schema()`) each time the site is built. Unknown fields are
refused with their path; contradictions between fields (for example free bits at or above
log K, or a cohort size above 1 with Optuna) are refused naming the fields involved. The
[concepts](../concepts/design.md) page says how a spec becomes trials; the
[science guide](../science/index.md) what the `analysis` section computes.

"""

REST_INTRO = """# REST API reference

Generated from the service's OpenAPI document each time the site is built (a running
service serves the same document at `/openapi.json`). Every path is under `/api/v1`. Writes
need `Authorization: Bearer <token>`; reads too when `KSWEEP_READ_AUTH=true`. Every error is
an RFC 9457 problem document (`application/problem+json`) whose `errors` list names the
offending field path. The [operations](../operations.md) page lists the settings behind the
limits (body size, trials per sweep, active sweeps per owner).

"""

CLI_INTRO = """# CLI reference: `ksweep`

Generated from the Typer app (`ksweep.cli:app`) each time the site is built. The client
commands (`submit`, `status`, `watch`, `cancel`, `extend`, `report`, `export`) talk to the
service at `KSWEEP_URL` with `KSWEEP_TOKEN`; `train` and `sweep run` train in-process without
it. `ksweep extend ID --seeds 3,4 --validate` is the dry run of an extension and `ksweep report
ID1 ID2` one report over compatible sweeps ([sweeps that grow](../guide/growing.md)).

"""


def sweep_spec_page() -> str:
    """The spec reference: the schema as Markdown, then every example spec, in name order."""
    from sweeps.spec import SweepSpec

    parser = jsonschema2md.Parser(show_examples="all", header_level=1)
    schema_md = PATTERN_TESTER.sub("", "".join(parser.parse_schema(SweepSpec.model_json_schema())))
    schema_md = LIST_INDENT.sub(lambda match: match.group(1) * 2, schema_md)
    examples = sorted(EXAMPLES.glob("*.yaml"))
    if not examples:
        raise RuntimeError(f"no example spec in {EXAMPLES}: the reference must show them")
    parts = [SPEC_INTRO, schema_md, "\n## Example specs\n\n"]
    for path in examples:
        parts.append(f"### `{path.relative_to(ROOT)}`\n\n```yaml\n{path.read_text().rstrip()}\n```\n\n")
    return "".join(parts)


def rest_page() -> str:
    """The REST reference from the OpenAPI document, its own title replaced by ours."""
    from service.api.app import create_app

    body = OpenAPIV3DocumentationHandler(create_app().openapi(), style="MARKDOWN").write()
    body = re.sub(r"^# .*$", "", body, count=1, flags=re.MULTILINE)
    return REST_INTRO + body


def cli_page() -> str:
    """The CLI reference by ``typer ksweep.cli utils docs``, its title replaced by ours."""
    out = subprocess.run(
        [sys.executable, "-m", "typer", "ksweep.cli", "utils", "docs", "--name", "ksweep"],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    out = re.sub(r"^# .*$", "", out, count=1, flags=re.MULTILINE)
    return CLI_INTRO + out


for name, build in (("sweep-spec", sweep_spec_page), ("rest", rest_page), ("cli", cli_page)):
    with mkdocs_gen_files.open(f"reference/{name}.md", "w") as handle:
        handle.write(build())
