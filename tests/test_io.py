"""Atomic output: all or nothing, readable by others like any plain file."""

from __future__ import annotations

import os
import stat

import pytest

from ragrl.io import atomic_dir, atomic_path, write_json


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_failed_dir_keeps_previous_version(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "a").write_text("v2")
            raise RuntimeError("killed")
    assert (target / "a").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_outputs_get_plain_file_modes(tmp_path):
    old = os.umask(0o022)
    try:
        write_json({"a": 1}, tmp_path / "x.json")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
