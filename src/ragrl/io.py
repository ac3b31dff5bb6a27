"""Atomic file output.

Every file the workflow produces is written to a temporary sibling and renamed into place, so a
killed or failed job never leaves a truncated file that Snakemake (or a user) would take as done.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: Path, directory: bool) -> None:
    # mkstemp/mkdtemp create private files (0600/0700); results are shared with a group on a
    # cluster, so give the final file the mode a plain open() would have.
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def publish_tree_modes(root: str | os.PathLike) -> None:
    """Give `root` and everything under it the modes a plain open()/mkdir() would have (executables
    stay executable). Writers that go through their own temporary files leave them private:
    transformers' save_pretrained publishes model.safetensors as 0600."""
    mask = _umask()
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        executable = path.is_dir() or path.stat().st_mode & 0o100
        os.chmod(path, (0o777 if executable else 0o666) & ~mask)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _publish_mode(tmp_path, directory=False)
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        publish_tree_modes(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def read_columns(path: str | os.PathLike, columns: list[str], optional: tuple[str, ...] | None = ()) -> pa.Table:
    """`columns` (and those of `optional` the file has; every other column when `optional` is
    None) of a parquet file; a missing column is an error naming the file, the column and what the
    file has, not Arrow's bare field lookup."""
    from ragrl.errors import DataFormatError

    try:
        # a directory is a dataset of parquet parts, as pq.read_table reads it
        names = (pq.ParquetDataset(path).schema if os.path.isdir(path) else pq.read_schema(path)).names
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise DataFormatError(path, f"not a readable parquet file ({exc})") from None
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataFormatError(path, f"missing column(s) {missing}; the file has {names}")
    extra = names if optional is None else optional
    return pq.read_table(path, columns=list(columns) + [c for c in extra if c in names and c not in columns])


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    """Write an Arrow table atomically. Same table and library versions give the same bytes."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write JSON atomically with sorted keys, so equal objects give equal bytes."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def canonical_json(obj: Any) -> str:
    """One spelling per value (sorted keys, no spaces): what config hashes and fingerprints hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
