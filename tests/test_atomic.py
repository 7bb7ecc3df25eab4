"""core.atomic: a write that fails leaves the old file whole and no temporary file behind."""
import pytest

from core import atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_open(path) as f:
            f.write("new, cut short")
            raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_whole_write_replaces_the_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    atomic.write_text(path, "new")
    assert path.read_text() == "new"


def test_a_set_is_written_with_its_last_file_renamed_last(tmp_path, monkeypatch):
    a, b = tmp_path / "a.csv", tmp_path / "b.json"
    renamed = []
    real = atomic.os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda s, d: (renamed.append(d), real(s, d)))
    atomic.write_together({b: "B", a: "A"}, last=b)
    assert [str(p) for p in renamed] == [str(a), str(b)]
    assert a.read_text() == "A" and b.read_text() == "B"
