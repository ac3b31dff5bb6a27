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


def test_files_written_private_inside_a_dir_get_plain_modes(tmp_path):
    # Issue 18 F12: transformers' save_pretrained publishes model.safetensors as 0600 (through its
    # own temporary file); a weights file must be readable like the config next to it.
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "model") as tmp:
            fd = os.open(tmp / "model.safetensors", os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
            (tmp / "sub").mkdir(mode=0o700)
            (tmp / "sub" / "run.sh").write_text("#!/bin/sh\n")
            os.chmod(tmp / "sub" / "run.sh", 0o700)
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE((tmp_path / "model" / p).stat().st_mode)  # noqa: E731
    assert (mode("model.safetensors"), mode("sub"), mode("sub/run.sh")) == (0o644, 0o755, 0o755)


def test_qa_rows_keep_every_column_and_a_missing_one_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragrl.errors import DataFormatError
    from ragrl.data.qa import read_qa_rows

    good = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"id": ["q1", "q2"], "question": ["a?", "b?"], "golden_answers": [["A"], ["B"]],
                             "metadata": ['{"type": "1hop"}', "{}"], "supporting_ids": [["w1"], []]}), good)
    rows = read_qa_rows(good, limit=1)
    assert rows == [{"id": "q1", "question": "a?", "golden_answers": ["A"], "metadata": '{"type": "1hop"}',
                     "supporting_ids": ["w1"]}]
    bad = tmp_path / "no_golds.parquet"
    pq.write_table(pa.table({"id": ["q1"], "question": ["a?"]}), bad)
    with pytest.raises(DataFormatError, match=r"no_golds\.parquet.*golden_answers"):
        read_qa_rows(bad)


def test_a_directory_of_parquet_parts_reads_as_one_table_and_a_missing_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragrl.errors import DataFormatError
    from ragrl.io import read_columns

    parts = tmp_path / "qa"
    parts.mkdir()
    pq.write_table(pa.table({"id": ["q1"], "question": ["a?"], "extra": [1]}), parts / "part-0.parquet")
    pq.write_table(pa.table({"id": ["q2"], "question": ["b?"], "extra": [2]}), parts / "part-1.parquet")
    table = read_columns(parts, ["id", "question"])
    assert sorted(table.column("id").to_pylist()) == ["q1", "q2"] and table.column_names == ["id", "question"]
    with pytest.raises(DataFormatError, match=r"qa.*missing column\(s\) \['golden_answers'\]"):
        read_columns(parts, ["id", "golden_answers"])
