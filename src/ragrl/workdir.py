"""Work directories of resumable jobs (RL, KG construction, HARR's retriever training).

A resumable job keeps its progress (checkpoints) in a work directory that outlives a killed
attempt. Resuming is only right when the progress belongs to exactly the job being run, so the
directory is keyed on a fingerprint of everything that defines the job: its settings *and the
content* of every input file. A path or a recipe alone is not enough: re-running SFT rewrites
the same `sft_merged/` path with other weights, and resuming RL from checkpoints of the old
weights would ship a model of the old pipeline under the new one's name.

When the fingerprint differs, the previous job's files are moved aside to
`superseded-<fingerprint>/`, not deleted: they are removed only once the new job has saved its
first checkpoint (`release_superseded`), so a settings typo or a crash before that costs nothing.
Coming back to the superseded definition moves its files back and resumes them.

One job at a time: the job takes an exclusive advisory lock (`flock`) on `.job.lock` in the
work directory before anything else and holds it for the rest of its process's life (and in any
child it hands the descriptor to, `held_fds`). A second job on the same directory fails at once
with `WorkDirBusy`, naming the directory and the process holding it. The kernel releases the lock
when the last process holding it ends, however it ends (`kill -9` included), so the lock is never
stale and needs no cleanup; a job whose `bash -c` wrapper or snakemake was killed while it kept
running still holds it (issue 34 F6). On a file system without locks (some Lustre mounts) the job
runs unguarded, with a warning.

Cost: inputs are hashed in full with SHA-256, once per job start. Measured on the project's
2-core machine, files in the page cache: the default tiny policy (16 MB) in 0.03 s, 1 GiB in
1.2 s, so a 3B bf16 policy (6 GB) takes ~7 s and a 7B one ~17 s, plus the disk read when cold;
a flat index of a 21M-passage corpus (~60 GB) would take about a minute. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ragrl.errors import RagrlError

STAMP = "definition.sha256"
DEFINITION = "definition.json"
SUPERSEDED = "superseded-"
LOCK = ".job.lock"
_CHUNK = 1 << 20
# Work directory (resolved) -> descriptor of its lock file, open for the life of the process: the
# lock is held as long as the descriptor is, and a second open() of the file in this process
# would be a second lock that conflicts with the first.
_HELD: dict[Path, int] = {}


class WorkDirBusy(RagrlError, RuntimeError):
    """Another live process holds the work directory's lock."""


# A model directory's record of the hosts that trained it (ragrl.hostinfo.RECORD): where the model
# came from, not what it is, so two directories with the same weights fingerprint alike.
PROVENANCE_FILES = ("host.json",)


def content_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, or of a directory's files (relative names and contents, in
    sorted order). Hidden entries (".name.tmp" leftovers of atomic writes) and a top-level
    PROVENANCE_FILES entry are skipped."""
    path = Path(path)
    if path.is_file():
        return _file_digest(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory to fingerprint")
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or rel.as_posix() in PROVENANCE_FILES:
            continue
        h.update(f"{rel.as_posix()}\0{_file_digest(file)}\n".encode())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe(definition: Mapping[str, Any], inputs: Mapping[str, str | os.PathLike | None] | None = None) -> dict:
    """What a job's fingerprint is computed from: its settings, and for each named input the
    digest of its content. An input that is not a local path (a model hub id) counts by name."""
    digests = {}
    for name, value in sorted((inputs or {}).items()):
        if value is None:
            continue
        digests[name] = content_digest(value) if Path(value).exists() else f"name:{value}"
    return {"settings": json.loads(json.dumps(definition, sort_keys=True, default=str)), "inputs": digests}


def fingerprint(description: Mapping[str, Any]) -> str:
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def prepare_work_dir(
    out_dir: str | os.PathLike,
    definition: Mapping[str, Any],
    inputs: Mapping[str, str | os.PathLike | None] | None = None,
    *,
    log: Callable[[str], None] = print,
    tag: str = "job",
    wait_s: float = 600.0,
) -> str:
    """Make `out_dir` hold only progress of the job defined by `definition` + `inputs`; return
    its fingerprint. Call it after the settings are validated and before any work.

    Under a multi-process launcher (`accelerate launch`, torchrun: RANK set) only rank 0 moves
    files; the other ranks wait up to `wait_s` for its stamp, so no two processes move one entry.
    Rank 0 (or the only process) holds the directory's lock from here to its exit; a directory
    another live job holds raises `WorkDirBusy` before anything is hashed or moved."""
    out_dir = Path(out_dir)
    if is_main_process():
        lock_work_dir(out_dir, log=log, tag=tag)
    description = describe(definition, inputs)
    current = fingerprint(description)
    stamp = out_dir / STAMP
    if not is_main_process():
        deadline = time.monotonic() + wait_s
        while not (stamp.is_file() and stamp.read_text().strip() == current):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {os.environ['RANK']}: {stamp} did not get this job's fingerprint "
                                   f"from rank 0 within {wait_s:.0f} s")
            time.sleep(0.5)
        return current
    previous = stamp.read_text().strip() if stamp.is_file() else None
    if previous != current:
        owned = _owned_entries(out_dir)
        if owned:
            aside = _aside_dir(out_dir, previous)
            aside.mkdir()
            for entry in owned:
                os.replace(entry, aside / entry.name)
            log(f"[{tag}] {out_dir} held work of another definition ({_what_changed(aside, description)}); "
                f"moved it to {aside.name}/, which is deleted once this run saves its first checkpoint")
        earlier = out_dir / f"{SUPERSEDED}{current[:16]}"
        if earlier.is_dir() and (earlier / STAMP).is_file() and (earlier / STAMP).read_text().strip() == current:
            for entry in earlier.iterdir():
                if entry.name == LOCK:  # never moved aside; a stray one is not this job's lock
                    entry.unlink()
                    continue
                os.replace(entry, out_dir / entry.name)
            earlier.rmdir()
            log(f"[{tag}] restored the work of this exact definition from {earlier.name}/")
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / DEFINITION, json.dumps(description, indent=2, sort_keys=True) + "\n")
    _write(stamp, current + "\n")
    return current


def lock_work_dir(out_dir: str | os.PathLike, *, log: Callable[[str], None] = print, tag: str = "job") -> bool:
    """Take `out_dir`'s exclusive lock for the life of this process (creating the directory);
    True when held, False on a file system without locks. Taking it again in the same process is
    a no-op. Raises `WorkDirBusy` when another process holds it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    key = out_dir.resolve()
    if key in _HELD:
        return True
    path = key / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise WorkDirBusy(
                f"work directory {out_dir} is in use by another job ({_holder(path)}); two jobs on one work "
                f"directory would write the same files. Wait for it to end or stop it, then run again") from None
        log(f"[{tag}] warning: cannot lock {path} ({exc.strerror}): this file system has no locks, so nothing "
            f"stops a second job on {out_dir} while this one runs")
        return False
    os.ftruncate(fd, 0)
    argv = " ".join(sys.argv)[:200]
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {sys.executable} {argv}\n".encode(), 0)
    _HELD[key] = fd
    return True


def release_work_dir(out_dir: str | os.PathLike) -> None:
    """Give `out_dir`'s lock up before this process ends (a process that goes on to other work)."""
    fd = _HELD.pop(Path(out_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


def held_fds(out_dir: str | os.PathLike) -> tuple[int, ...]:
    """The descriptor of `out_dir`'s lock if this process holds it, for `subprocess`'s `pass_fds`:
    a child given it holds the lock too, as long as it runs, even if this process is killed."""
    fd = _HELD.get(Path(out_dir).resolve())
    return (fd,) if fd is not None else ()


def _holder(lock: Path) -> str:
    """Who holds `lock`: the local processes that have it open (a contender closes it at once),
    else what its holder wrote into it (another host, or another user's processes)."""
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        if fd_dir.parent.name == str(os.getpid()):
            continue
        try:
            if any(os.readlink(link) == str(lock) for link in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    if pids:
        return "held by " + "; ".join(f"pid {pid}: {_cmdline(pid)}" for pid in sorted(pids))
    try:
        recorded = lock.read_text().strip()
    except OSError:
        recorded = ""
    return f"locked by {recorded}" if recorded else f"{lock} is locked"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def is_main_process() -> bool:
    """Rank 0 of a multi-process launch (RANK, as accelerate and torchrun set it), or no launcher."""
    return int(os.environ.get("RANK", "0")) == 0


def release_superseded(out_dir: str | os.PathLike) -> list[Path]:
    """Delete the work of earlier definitions; call once the current job has a checkpoint."""
    removed = []
    root = Path(out_dir)
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith(SUPERSEDED) and entry.is_dir():
                shutil.rmtree(entry)
                removed.append(entry)
    return removed


def _owned_entries(out_dir: Path) -> list[Path]:
    if not out_dir.is_dir():
        return []
    return sorted(e for e in out_dir.iterdir() if not e.name.startswith(SUPERSEDED) and e.name != LOCK)


def _aside_dir(out_dir: Path, previous: str | None) -> Path:
    base = f"{SUPERSEDED}{(previous or 'unstamped')[:16]}"
    candidate, k = out_dir / base, 1
    while candidate.exists():
        candidate, k = out_dir / f"{base}-{k}", k + 1
    return candidate


def _what_changed(aside: Path, description: Mapping[str, Any]) -> str:
    try:
        before = json.loads((aside / DEFINITION).read_text())
    except (OSError, ValueError):
        return "no record of its definition"
    changed = [f"input '{k}'" for k in sorted(set(before.get("inputs", {})) | set(description["inputs"]))
               if before.get("inputs", {}).get(k) != description["inputs"].get(k)]
    old, new = before.get("settings", {}), description["settings"]
    changed += [f"setting '{k}'" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "changed: " + ", ".join(changed) if changed else "same content, older stamp"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
