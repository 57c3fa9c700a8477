"""Project layout rules: `operator/` is a folder, the stdlib `operator` still imports."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_stdlib_operator_is_not_shadowed_from_repo_root() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import operator, sys; print(operator.__file__); print(operator.add(2, 3))"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out[1] == "5"
    assert "lib" in out[0] and not out[0].startswith(str(REPO / "operator"))
    assert not (REPO / "operator" / "__init__.py").exists()


def test_operator_package_importable() -> None:
    import inferasim_operator  # noqa: F401


def test_every_package_folder_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(cfg["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "inferasim").rglob("__init__.py")}
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"


def test_library_never_imports_kubernetes_or_kopf() -> None:
    for path in (REPO / "inferasim").rglob("*.py"):
        text = path.read_text()
        for bad in ("import kopf", "import kubernetes", "from kubernetes", "from kopf"):
            assert bad not in text, f"{path} imports {bad.split()[-1]}"
