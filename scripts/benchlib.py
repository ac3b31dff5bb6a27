"""Helpers shared by the benchmark scripts (scripts/bench_*.py).

Not part of the ragrl package: the scripts run as `python scripts/bench_x.py`, so this file is
imported from the scripts' own directory. It holds what both benchmarks do the same way: logging
to stderr, the children's environment, running a child and measuring it (wall, CPU, peak RSS from
os.wait4, a /proc sampler for the anonymous / file-backed split), /proc readers, machine info, a
`ragrl serve-*` server on 127.0.0.1 stopped by its pid, the closed-loop client harness, and the
bookkeeping of a run (results.json rewritten after every stage, stages run in order, a markdown
summary at the end).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ragrl.hostinfo import cpu_model

MB = 1024 * 1024
T0 = time.monotonic()  # when the benchmark (which imports this first) started
_log_tag = "bench"


# --------------------------------------------------------------------------- logging, children


def set_log_tag(tag: str) -> None:
    """The tag in front of every log line: `[TAG   12.3s] message`."""
    global _log_tag
    _log_tag = tag


def log(msg: str) -> None:
    print(f"[{_log_tag} {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child: offline Hugging Face hub and no tokenizers
    parallelism unless the caller's environment says otherwise, then `extra` on top."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return env


def ragrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ragrl", *args]


def logged_command(log: Path, subcommand: str) -> list[str]:
    """The arguments after `ragrl` of the command a workflow job logged on its log's first line
    (`$ ragrl <subcommand> ...`), to re-run it with some options changed (`with_option`)."""
    with open(log) as f:
        words = shlex.split(f.readline().removeprefix("$ "))
    if words[:2] != ["ragrl", subcommand]:
        raise SystemExit(f"{log}: first line is not a `ragrl {subcommand}` command")
    return words[1:]


def with_option(args: list[str], option: str, value: str) -> list[str]:
    """`args` with the value of `option` (given once) replaced."""
    at = args.index(option)
    return [*args[: at + 1], value, *args[at + 2:]]


# --------------------------------------------------------------------------- /proc


def proc_status_kb(pid: int | str = "self") -> dict[str, int]:
    """Resident-memory lines of /proc/<pid>/status, in KiB; {} once the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError, ValueError, PermissionError):
        pass
    return out


def rss_mb(pid: int | str = "self") -> dict[str, float]:
    """{"rss_mb", "peak_rss_mb"} (VmRSS, VmHWM) of a live process, in MB."""
    s = proc_status_kb(pid)
    return {"rss_mb": round(s.get("VmRSS", 0) / 1024, 1), "peak_rss_mb": round(s.get("VmHWM", 0) / 1024, 1)}


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


class RssSampler(threading.Thread):
    """Polls /proc/<pid>/status; keeps the peaks of anonymous and file-backed resident memory.

    ru_maxrss (from wait4) is exact but does not say what the memory was; the sampler's split can
    miss a short spike between polls, so both are reported.
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            status = proc_status_kb(self.pid)
            for k in self.peak:
                if k in status:
                    self.peak[k] = max(self.peak[k], status[k])
            self._stop_event.wait(self.interval)

    def stop(self) -> dict[str, float]:
        self._stop_event.set()
        self.join()
        return {
            "sampled_peak_rss_anon_mb": round(self.peak["RssAnon"] / 1024, 1),
            "sampled_peak_rss_file_mb": round(self.peak["RssFile"] / 1024, 1),
            "sampled_peak_rss_mb": round(self.peak["VmRSS"] / 1024, 1),
        }


def run_measured(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `cmd` to completion (environment: child_env(env)); wall time, CPU time and peak RSS of
    that one child (os.wait4), plus the sampler's anonymous / file-backed peaks."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    shown = " ".join(cmd[2:] if cmd[:2] == [sys.executable, "-m"] else cmd)
    log(f"$ {' '.join([*(f'{k}={v}' for k, v in (env or {}).items()), shown])}  (log: {log_path})")
    start = time.monotonic()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(env))
        sampler = RssSampler(proc.pid)
        sampler.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            sampler.stop()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; tell Popen
        wall = time.monotonic() - start
    sampled = sampler.stop()
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"command failed with exit code {proc.returncode}: {cmd}\n--- log tail ---\n{tail}")
    result = {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "cpu_user_s": round(usage.ru_utime, 2),
        "cpu_sys_s": round(usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        **sampled,
    }
    log(f"  done in {result['wall_s']} s, peak RSS {result['peak_rss_mb']} MB "
        f"(sampled anon {sampled['sampled_peak_rss_anon_mb']} MB, file {sampled['sampled_peak_rss_file_mb']} MB)")
    return result


# --------------------------------------------------------------------------- figures, machine


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def median_or_none(values: list[Any], ndigits: int = 2) -> float | None:
    """Median of the values that are not None, rounded; None if there are none."""
    values = [v for v in values if v is not None]
    return round(float(np.median(values)), ndigits) if values else None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_info(packages: Iterable[str] = ()) -> dict[str, Any]:
    """Platform, CPUs (count and the ones this process may run on), CPU model, memory, and the
    installed versions of `packages` (those not installed are left out)."""
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    try:
        info["cpu_model"] = cpu_model(Path("/proc/cpuinfo").read_text())
        mem = [line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")]
        info["mem_total_gib"] = round(int(mem[0].split()[1]) / 1024 / 1024, 1) if mem else None
    except OSError:
        pass
    info["versions"] = {}
    for p in packages:
        try:
            info["versions"][p] = version(p)
        except PackageNotFoundError:
            pass
    return info


# --------------------------------------------------------------------------- a server under load


class ServerProcess:
    """A `ragrl serve-*` subprocess on 127.0.0.1 (an ephemeral port), ready once GET /health
    answers 200; stopped by its pid (terminate, kill after 30 s). Subclasses give the command."""

    health_poll_s = 0.1  # pause between /health probes while starting

    def __init__(self, log_path: Path, startup_timeout: float, env: dict[str, str] | None = None,
                 sample_rss_s: float | None = None) -> None:
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.env = env or {}
        self.sample_rss_s = sample_rss_s  # poll /proc for anon/file-backed RSS peaks every this many s
        self.proc: subprocess.Popen | None = None
        self.sampler: RssSampler | None = None
        self.startup_s: float | None = None

    def command(self, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def __enter__(self):
        import httpx

        with socket.socket() as s:  # ephemeral port; the tiny race with other binders is acceptable here
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = self.command("127.0.0.1", self.port)
        env = "".join(f" {k}={v}" for k, v in self.env.items())
        log(f"  starting `{' '.join(cmd[2:])}`{env} (log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=child_env(self.env))
        if self.sample_rss_s:
            self.sampler = RssSampler(self.proc.pid, interval=self.sample_rss_s)
            self.sampler.start()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
                if time.monotonic() - start > self.startup_timeout:
                    raise TimeoutError(f"server not healthy after {self.startup_timeout} s; see {self.log_path}")
                try:
                    if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(self.health_poll_s)
        except BaseException:
            self.__exit__()
            raise
        self.startup_s = round(time.monotonic() - start, 2)
        log(f"  server pid {self.proc.pid} healthy after {self.startup_s} s")
        return self

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"{self.url}/health", timeout=30.0).json()

    def cpu_s(self) -> float | None:
        return proc_cpu_s(self.proc.pid) if self.proc else None

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)["rss_mb"]

    def peak_rss_mb(self) -> float:
        return rss_mb(self.proc.pid)["peak_rss_mb"]

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # by pid: exactly the process this object started
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.sampler is not None:
            self.sampler.stop()
        if getattr(self, "_log", None):
            self._log.close()
        log(f"  server stopped (exit {self.proc.returncode if self.proc else None})")


class ClosedLoop:
    """`clients` closed-loop client threads against a ServerProcess, timed together.

    Each client thread (the `client(i)` given to run) connects and warms up, then calls
    `deadline = loop.start_line()`, sends requests until the deadline, recording into
    `latencies[i]`, `errors[i]` and `error_samples` (keep it to 5), and calls `loop.finished(i)`.
    run() measures the window between the start and the last client's end: wall time, the
    server's CPU time (/proc) and this process's CPU time (the clients')."""

    def __init__(self, clients: int) -> None:
        self.clients = clients
        self.latencies: list[list[float]] = [[] for _ in range(clients)]
        self.errors = [0] * clients
        self.error_samples: list[str] = []
        self._ends = [0.0] * clients
        self._ready = threading.Barrier(clients + 1)  # every client warmed up and connected
        self._go = threading.Barrier(clients + 1)  # deadline set, counters read: start
        self._deadline = 0.0

    def start_line(self) -> float:
        self._ready.wait()
        self._go.wait()
        return self._deadline

    def finished(self, i: int) -> None:
        self._ends[i] = time.monotonic()

    def run(self, client: Callable[[int], None], server: ServerProcess, duration: float,
            on_ready: Callable[[], None] | None = None) -> dict[str, Any]:
        """Start the clients, time `duration` seconds of load; `on_ready` runs once every client is
        connected, before the counters are read (so what it costs the server is not counted)."""
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(self.clients)]
        for th in threads:
            th.start()
        self._ready.wait()
        if on_ready is not None:
            on_ready()
        cpu_before = server.cpu_s()
        self_before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        self._deadline = start + duration
        self._go.wait()
        for th in threads:
            th.join()
        wall = max(self._ends) - start
        cpu_after = server.cpu_s()
        self_after = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "wall_s": wall,
            "latencies": [x for per in self.latencies for x in per],
            "server_cpu_s": (cpu_after - cpu_before) if cpu_before is not None and cpu_after is not None else None,
            "client_cpu_s": (self_after.ru_utime + self_after.ru_stime) - (self_before.ru_utime + self_before.ru_stime),
        }


# --------------------------------------------------------------------------- the run


class BenchRun:
    """A benchmark run's results: OUT_DIR/results.json, rewritten after every stage so a crash
    keeps what was measured; a run without the `world` stage adds to an earlier run's results."""

    def __init__(self, args: Any, out_dir: Path, packages: Iterable[str], **extra: Any) -> None:
        self.args = args
        self.out = out_dir.resolve()
        self.logs = self.out / "logs"
        self.results_path = self.out / "results.json"
        self.results: dict[str, Any] = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine_info(packages),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **extra,
            "loadavg": {},
        }

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.results_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=2) + "\n")
        os.replace(tmp, self.results_path)

    def stage_start(self, name: str) -> None:
        self.results["loadavg"][name] = loadavg()
        log(f"=== stage {name} (load average {self.results['loadavg'][name]}) ===")

    def generate_world(self, world: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """`ragrl world --seed SEED --size SIZE --out WORLD` (WORLD emptied first), measured;
        returns the measures and the world's manifest."""
        if world.exists():
            shutil.rmtree(world)
        m = run_measured(ragrl_cmd("world", "--seed", str(self.args.seed), "--size", self.args.size,
                                   "--out", str(world)), self.logs / "world.log")
        return m, json.loads((world / "manifest.json").read_text())

    def begin(self, merge: bool) -> None:
        """Create OUT_DIR; with `merge` and an earlier results.json there, continue that one."""
        self.out.mkdir(parents=True, exist_ok=True)
        if merge and self.results_path.exists():
            previous = json.loads(self.results_path.read_text())
            commands = previous.get("commands", [previous.get("command")])
            previous.update({k: v for k, v in self.results.items() if k not in ("loadavg", "started")})
            previous["commands"] = [*commands, self.results["command"]]
            previous.setdefault("loadavg", {})
            previous.pop("failed_stages", None)
            self.results = previous
            log(f"merging into {self.results_path}")
        else:
            self.results["commands"] = [self.results["command"]]

    def run_stages(self, order: Iterable[str], selected: Iterable[str], fns: dict[str, Callable[[], None]],
                   fatal: Iterable[str] = ()) -> list[str]:
        """Run the selected stages in `order`; a failed stage is recorded and the rest still run,
        unless it is one of `fatal` (later stages need what it makes). Returns the failed ones."""
        selected, fatal = set(selected), set(fatal)
        failed = []
        for name in order:
            if name not in selected:
                continue
            t = time.monotonic()
            try:
                fns[name]()
            except Exception as exc:  # noqa: BLE001 - record, keep what the other stages can still measure
                log(f"stage {name} FAILED: {type(exc).__name__}: {exc}")
                self.results.setdefault("failed_stages", {})[name] = f"{type(exc).__name__}: {exc}"[:4000]
                failed.append(name)
                self.save()
                if name in fatal:
                    break
            self.results.setdefault("stage_seconds", {})[name] = round(time.monotonic() - t, 1)
            self.save()
        return failed

    def finish(self, summary_markdown: Callable[[dict[str, Any]], str]) -> None:
        """Final save; the markdown summary to OUT_DIR/summary.md and stdout."""
        self.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.results["total_seconds_last_run"] = round(time.monotonic() - T0, 1)
        self.save()
        write_summary(self.out, summary_markdown(self.results))
        log(f"results: {self.results_path}; summary: {self.out / 'summary.md'}; "
            f"total {self.results['total_seconds_last_run']} s")


def write_summary(out_dir: Path, md: str) -> None:
    (out_dir / "summary.md").write_text(md + "\n")
    print(md)


# --------------------------------------------------------------------------- A/B in one process


def add_ab_arguments(parser, rounds: int = 2) -> None:
    """--rounds, --threads (torch intra-op; the workflow's training and evaluation jobs use 1) and --out."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="JSON file (default: stdout)")


def alternating_rounds(names: list[str], rounds: int, measure: Callable[[str, int], Any]) -> list[dict[str, Any]]:
    """One dict {name: measure(name, round)} per round, the order of `names` reversed every other
    round: on a shared machine a ratio is only as good as the noise between two neighbouring runs,
    and whichever goes first warms caches for the other."""
    return [{name: measure(name, r) for name in (names if r % 2 == 0 else names[::-1])} for r in range(rounds)]


def emit_json(report: dict[str, Any], out: str | None) -> None:
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    else:
        print(text)
