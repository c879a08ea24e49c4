"""docs/concepts.md's map of the code matches the package's modules."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_map_names_every_module_and_only_those():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "code_map.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    doc = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    for path in (ROOT / "airflow_hetero_gpu").rglob("*.py"):
        rel = path.relative_to(ROOT / "airflow_hetero_gpu").as_posix()
        if "__pycache__" not in rel and path.name != "__init__.py":
            assert f"| `{rel}` |" in doc, rel
    assert "(no docstring)" not in doc


def test_a_stale_map_is_reported(tmp_path):
    """The check compares against the files: a module the map does not list fails it."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "airflow_hetero_gpu", copy / "airflow_hetero_gpu",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    (copy / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "concepts.md", copy / "docs" / "concepts.md")
    (copy / "airflow_hetero_gpu" / "core" / "brand_new.py").write_text('"""A module nobody mapped."""\n')
    r = subprocess.run([sys.executable, str(copy / "scripts" / "code_map.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "+| `core/brand_new.py` | A module nobody mapped. |" in r.stderr
