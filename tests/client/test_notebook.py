"""examples/client_notebook.ipynb executed against a real service (nbclient, an ipykernel
kernel), and committed without outputs."""

from __future__ import annotations

import json
import time

import pytest

from tests.client.conftest import repo_root
from tests.support.groups import client_service

NOTEBOOK = repo_root() / "examples" / "client_notebook.ipynb"


def test_committed_notebook_has_no_outputs():
    notebook = json.loads(NOTEBOOK.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code, "the notebook has no code cells"
    for cell in code:
        assert cell["outputs"] == [] and cell["execution_count"] is None, (
            f"cell {cell.get('id')} has outputs: clear them before committing "
            "(Jupyter: Edit > Clear Outputs of All Cells)")


@pytest.mark.slow
@client_service
def test_notebook_runs_against_the_service(service_env, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for key, value in service_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", str(repo_root()))  # the kernel imports this checkout
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    start = time.monotonic()
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    print(f"notebook ran in {time.monotonic() - start:.1f} s")
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    text = "\n".join(out.get("text", "") + out.get("data", {}).get("text/plain", "")
                     for out in outputs)
    assert " succeeded " in text
    assert any("image/png" in out.get("data", {}) for out in outputs), "no figure drawn"
    paired = notebook.cells[-2].outputs[0]["data"]["text/plain"]
    assert "difference" in paired and len(paired.strip().splitlines()) == 2 + 2  # header + 2 seeds
    assert "paired mean difference from trials:" in text
