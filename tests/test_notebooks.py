"""Execute every notebook in ``notebooks/`` (CI runs them through this test).

The code cells run in order in one namespace, in a temporary folder, with
matplotlib's non-interactive backend -- what a kernel would do, without
needing a Jupyter kernel on the machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PUBLIC_MODULES = {"parsearch.search", "parsearch.model.specs", "parsearch.model.files",
                  "parsearch.serve", "parsearch.query"}
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook() -> None:
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    cells = json.loads(path.read_text())["cells"]
    namespace: dict[str, object] = {"__name__": "__notebook__"}
    for number, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        for line in source.splitlines():  # only the public API
            if line.startswith(("from parsearch", "import parsearch")):
                assert line.split()[1] in PUBLIC_MODULES, line
        exec(compile(source, f"{path.name}[cell {number}]", "exec"), namespace)
    import matplotlib.pyplot as plt

    plt.close("all")
