"""The real outputs the tests read live in the repository (tests/data/real): a clone alone runs
every test. Where the project's collection also sits beside the repository (``../shared/data``),
each file both have must be byte for byte the same, so the copy never drifts from its sources."""

from __future__ import annotations

from pathlib import Path

from shared_data import IN_REPO, shared_data

BESIDE = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_the_tests_read_the_copy_in_the_repository_by_default(monkeypatch):
    monkeypatch.delenv("HETERO_GPU_SHARED_DATA", raising=False)
    assert shared_data() == IN_REPO
    files = _files(IN_REPO / "nvidia-smi")
    # every folder of the collection is here, each with where its files come from
    for folder in ("topo", "query", "query/errors", "h200-device"):
        assert any(f.startswith(folder + "/") for f in files), folder
    for folder in ("topo", "query", "h200-device"):
        assert f"{folder}/SOURCES.md" in files
    assert len([f for f in files if f.startswith("topo/") and f.endswith(".txt")]) >= 30


def _named_in_sources(root: Path, rel: str) -> bool:
    """A file is named in the SOURCES.md of the top folder it sits in, by its name or by its
    sub-folder (``captures-nvidia_gpu_exporter/*.txt``)."""
    top, _, rest = rel.partition("/")
    sources = (root / top / "SOURCES.md").read_text(encoding="utf-8")
    sub = rest.split("/")[0] if "/" in rest else ""
    return Path(rest).name in sources or bool(sub and f"{sub}/" in sources)


def test_every_file_of_the_copy_says_where_it_comes_from():
    root = IN_REPO / "nvidia-smi"
    files = sorted(f for f in _files(root) if not f.endswith("SOURCES.md"))
    assert [f for f in files if not _named_in_sources(root, f)] == []


def test_every_file_of_the_copy_equals_the_collection_beside_the_repository():
    """Checked wherever the collection sits beside the repository (as it does on the project's
    machines); a clone alone has only the copy, which the test above checks."""
    here = _files(IN_REPO)
    there = _files(BESIDE) if BESIDE.is_dir() else set()
    common = sorted((here & there) - {"README.md"})
    differ = [f for f in common if (IN_REPO / f).read_bytes() != (BESIDE / f).read_bytes()]
    assert differ == []
    if there:
        assert common, "the copy and the collection beside the repository share no file"
