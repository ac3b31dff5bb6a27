#!/usr/bin/env python
"""Benchmark the retrieval stack: index build, the HTTP service under concurrent clients, BM25.

A benchmark, not a test: it asserts nothing about speed, it measures and reports. Run it from the
repository root with the project's environment, e.g.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_retrieval.py --out-dir /tmp/ragrl-bench
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_retrieval.py --size small --duration 5   # quick run

What it does (every heavy step is the workflow's own CLI in a subprocess, so each step's peak RSS
is that step's alone; peak RSS comes from os.wait4's rusage, and a sampler of /proc/<pid>/status
splits it into anonymous (heap) and file-backed (mmap'd shards, page cache) memory):

  world     `ragrl world --size SIZE`                       synthetic corpus + QA ("bench" ~116k passages)
  embed     `ragrl index embed-shard` x SHARDS, one after another (as the workflow's jobs would)
  build     `ragrl index build --factory F` for Flat and HNSW32; wall, peak RSS vs index/embedding bytes
  bm25      `ragrl index bm25`; build wall and peak RSS
  inprocess load_searcher(Flat) in this process: passage encode rate, query encode vs FAISS search
            time (Flat and HNSW32), Searcher.search at batch 1 / 16 / 64
  service   `ragrl serve-retriever` subprocesses on 127.0.0.1 (ephemeral port): micro-batched
            (defaults: max_batch 64, 5 ms window), micro-batched with a 0 ms window, and serialized
            (max_batch 1: one request's encode+search at a time, like a server holding a lock).
            Closed-loop client threads (1 / 16 / 64), each sending single-query POST /retrieve
            requests as a Search-R1 rollout worker does, for --duration seconds per setting.
  bm25q     Searcher(bm25).search queries/s, one at a time and in batches of 64
  malformed one micro-batched server, --malformed-clients closed-loop clients (64), alternating
            rounds with no malformed requests and with --malformed-fraction (1%) of requests
            malformed (lone surrogate, 10^5 nested arrays, a 5000-digit topk, broken JSON,
            negative topk); throughput and p50/p99 of the good requests in both, same run, and
            how the malformed ones were answered (every one must be a 4xx, never a 5xx).

Queries are the world's QA test-split questions. Results: OUT_DIR/results.json (rewritten after
every stage, so a crash keeps what was measured) and a markdown summary on stdout and in
OUT_DIR/summary.md. The machine is assumed shared and noisy: the load average is recorded at the
start of every stage, and compare ratios measured in the same run rather than absolute numbers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib.py sits next to this script
from benchlib import (  # noqa: E402
    MB,
    BenchRun,
    ClosedLoop,
    ServerProcess,
    loadavg,
    log,
    median_or_none,
    pct,
    ragrl_cmd,
    run_measured,
    set_log_tag,
    write_summary,
)

set_log_tag("bench")
STAGES = ("world", "embed", "build", "bm25", "inprocess", "service", "bm25q", "malformed")
# Request bodies no client should send, one of each kind issue 18 (F5, F6) found answered with 500.
MALFORMED_BODIES: dict[str, bytes] = {
    "lone_surrogate": b'{"queries": ["abc \\ud800"], "topk": 3}',
    "deep_nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge_integer": b'{"queries": ["q"], "topk": ' + b"9" * 5000 + b"}",
    "broken_json": b'{"queries": ["unterminated',
    "negative_topk": b'{"queries": ["q"], "topk": -1}',
}
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
VERSIONS_OF = ("torch", "faiss-cpu", "sentence-transformers", "bm25s", "fastapi", "uvicorn", "httpx")
# Threading settings for the processes that encode queries. torch (its own libgomp) and faiss-cpu
# (another libgomp) each start one thread per core; on a small shared machine a preempted OpenMP
# thread stalls every parallel region, so one thread is also measured.
THREAD_ENVS: dict[str, dict[str, str]] = {
    "default": {},
    "1thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}
# Server configurations: `ragrl serve-retriever` flags (+ environment).
SERVICE_VARIANTS: dict[str, dict[str, Any]] = {
    # the defaults: gather up to 64 queries for 5 ms
    "microbatch": {"max_batch": 64, "batch_window_ms": 5.0, "env": {}},
    # batch whatever is already queued, never wait
    "microbatch_w0": {"max_batch": 64, "batch_window_ms": 0.0, "env": {}},
    # one request's encode + search at a time (one search thread, like a lock around the searcher)
    "serialized": {"max_batch": 1, "batch_window_ms": 0.0, "env": {}},
    "microbatch_1thread": {"max_batch": 64, "batch_window_ms": 5.0, "env": THREAD_ENVS["1thread"]},
    "serialized_1thread": {"max_batch": 1, "batch_window_ms": 0.0, "env": THREAD_ENVS["1thread"]},
    # not run by default: the defaults with OpenMP threads that sleep at once instead of spinning
    "microbatch_passive": {"max_batch": 64, "batch_window_ms": 5.0, "env": {"OMP_WAIT_POLICY": "PASSIVE"}},
}


# --------------------------------------------------------------------------- helpers


def file_mb(path: Path) -> float:
    return round(path.stat().st_size / MB, 1)


def timed_loop(fn: Callable[[list[str]], Any], queries: list[str], batch: int, duration: float,
               min_calls: int = 3) -> dict[str, Any]:
    """Call fn on successive batches (cycling through `queries`) for `duration` seconds."""
    lat, n, i = [], 0, 0
    start = time.monotonic()
    while True:
        chunk = [queries[(i + j) % len(queries)] for j in range(batch)]
        i += batch
        t = time.perf_counter()
        fn(chunk)
        lat.append(time.perf_counter() - t)
        n += batch
        if time.monotonic() - start >= duration and len(lat) >= min_calls:
            break
    elapsed = time.monotonic() - start
    return {
        "batch": batch,
        "queries": n,
        "calls": len(lat),
        "seconds": round(elapsed, 3),
        "qps": round(n / elapsed, 1),
        "ms_per_call_p50": round(pct(lat, 50) * 1000, 2),
        "ms_per_call_p99": round(pct(lat, 99) * 1000, 2),
        "ms_per_query": round(elapsed / n * 1000, 3),
    }


# --------------------------------------------------------------------------- stages


class Bench(BenchRun):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, args.out_dir, VERSIONS_OF)
        self.world = self.out / "world"
        self.passages = self.world / "passages.parquet"
        self.emb_dir = self.out / "embeddings"

    def shard_paths(self) -> list[Path]:
        n = self.args.shards
        return [self.emb_dir / f"shard-{i}-of-{n}.npy" for i in range(n)]

    def index_dir(self, factory: str) -> Path:
        return self.out / "index" / factory.replace(",", "_")

    def questions(self) -> list[str]:
        import pyarrow.parquet as pq

        qs = pq.read_table(self.world / "qa" / "test.parquet", columns=["question"]).column("question").to_pylist()
        qs = [q for q in qs if q.strip()]
        if not qs:
            raise RuntimeError("the world's QA test split has no questions")
        return qs

    def num_passages(self) -> int:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.passages).metadata.num_rows

    # -- stages
    def world_stage(self) -> None:
        self.stage_start("world")
        m, manifest = self.generate_world(self.world)
        self.results["world"] = {**m, "size": self.args.size, "seed": self.args.seed,
                                 "passages": manifest["passages"], "questions": manifest["questions"],
                                 "passages_parquet_mb": file_mb(self.passages)}

    def embed_stage(self) -> None:
        self.stage_start("embed")
        a = self.args
        n = self.num_passages()
        shards = []
        for i, path in enumerate(self.shard_paths()):
            m = run_measured(ragrl_cmd("index", "embed-shard", "--passages", str(self.passages), "--model", a.model,
                                       "--shard", str(i), "--num-shards", str(a.shards), "--out", str(path),
                                       "--batch-size", str(a.batch_size), "--max-length", str(a.max_length)),
                             self.logs / f"embed-shard-{i}.log")
            meta = json.loads(path.with_suffix(".json").read_text())
            rows = meta["stop"] - meta["start"]
            shards.append({**m, "shard": i, "rows": rows, "npy_mb": file_mb(path),
                           "passages_per_s": round(rows / m["wall_s"], 1)})
            log(f"  shard {i}: {rows} passages, {shards[-1]['passages_per_s']} passages/s (incl. startup)")
            self.results["embed"] = {"shards": shards}
            self.save()
        wall = sum(s["wall_s"] for s in shards)
        self.results["embed"] = {
            "model": a.model,
            "batch_size": a.batch_size,
            "max_length": a.max_length,
            "num_shards": a.shards,
            "passages": n,
            "wall_s_total": round(wall, 2),
            "passages_per_s": round(n / wall, 1),
            "peak_rss_mb_max": max(s["peak_rss_mb"] for s in shards),
            "embeddings_mb": round(sum(p.stat().st_size for p in self.shard_paths()) / MB, 1),
            "shards": shards,
        }

    def build_stage(self) -> None:
        self.stage_start("build")
        n = self.num_passages()
        emb_mb = round(sum(p.stat().st_size for p in self.shard_paths()) / MB, 1)
        builds = {}
        for factory in self.args.factories:
            out = self.index_dir(factory)
            m = run_measured(ragrl_cmd("index", "build", "--shards", *map(str, self.shard_paths()),
                                       "--factory", factory, "--passages", str(self.passages), "--out", str(out)),
                             self.logs / f"index-build-{factory.replace(',', '_')}.log")
            meta = json.loads((out / "meta.json").read_text())
            index_mb = file_mb(out / "index.faiss")
            builds[factory] = {
                **m,
                "passages": n,
                "passages_per_s": round(n / m["wall_s"], 1),
                "build_seconds_in_process": meta.get("build_seconds"),
                "passages_per_s_in_process": round(n / meta["build_seconds"], 1) if meta.get("build_seconds") else None,
                "meta_peak_rss_mb": meta.get("peak_rss_mb"),
                "index_mb": index_mb,
                "embeddings_mb": emb_mb,
                "peak_rss_over_index": round(m["peak_rss_mb"] / index_mb, 2),
                "peak_rss_minus_index_mb": round(m["peak_rss_mb"] - index_mb, 1),
            }
            log(f"  {factory}: index {index_mb} MB, embeddings {emb_mb} MB, peak RSS {m['peak_rss_mb']} MB")
            self.results["build"] = builds
            self.save()
        # Baseline: what a bare `python -m ragrl` process with the build's imports costs.
        probe = run_measured([sys.executable, "-c", "import faiss, numpy, pyarrow.parquet; "
                              "import ragrl.retrieval.dense"], self.logs / "import-baseline.log")
        self.results["build_import_baseline"] = probe

    def bm25_stage(self) -> None:
        self.stage_start("bm25")
        out = self.out / "index" / "bm25"
        m = run_measured(ragrl_cmd("index", "bm25", "--passages", str(self.passages), "--out", str(out)),
                         self.logs / "bm25-build.log")
        n = self.num_passages()
        size = sum(p.stat().st_size for p in out.iterdir()) / MB
        self.results["bm25_build"] = {**m, "passages": n, "passages_per_s": round(n / m["wall_s"], 1),
                                      "index_mb": round(size, 1)}

    def inprocess_stage(self) -> None:
        """Searcher.search in a process of its own, once per threading setting (see THREAD_ENVS)."""
        self.stage_start("inprocess")
        res: dict[str, Any] = {}
        for i, name in enumerate(self.args.inproc_threads):
            out_json = self.out / f"inprocess-{name}.json"
            extra = ["--encode-sample", str(self.args.encode_sample if i == 0 else 0)]
            m = run_measured(self.worker_cmd("inprocess", out_json, *extra), self.logs / f"inprocess-{name}.log",
                             env=THREAD_ENVS[name])
            res[name] = {**json.loads(out_json.read_text()), "process": m}
            self.results["inprocess"] = res
            self.save()

    def bm25q_stage(self) -> None:
        self.stage_start("bm25q")
        out_json = self.out / "bm25q.json"
        m = run_measured(self.worker_cmd("bm25q", out_json), self.logs / "bm25q.log")
        self.results["bm25_query"] = {**json.loads(out_json.read_text()), "process": m}

    def worker_cmd(self, kind: str, out_json: Path, *extra: str) -> list[str]:
        a = self.args
        return [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--worker-out", str(out_json),
                "--out-dir", str(self.out), "--topk", str(a.topk), "--inproc-duration", str(a.inproc_duration),
                "--inproc-batches", *map(str, a.inproc_batches), "--factories", *a.factories, *extra]

    def service_stage(self) -> None:
        self.stage_start("service")
        import httpx

        qs = self.questions()
        results: dict[str, Any] = {"topk": self.args.topk, "duration_s": self.args.duration,
                                   "rounds": self.args.rounds, "variants": {}}
        self.results["service"] = results
        pooled: dict[tuple[str, int], list[float]] = {}
        for rnd in range(self.args.rounds):
            for name in self.args.variants:
                cfg = SERVICE_VARIANTS[name]
                v = results["variants"].setdefault(name, {"config": cfg, "rounds": []})
                this: dict[str, Any] = {"clients": {}}
                v["rounds"].append(this)
                with RetrievalServer(self.index_dir("Flat"), cfg, self.logs / f"server-{name}-r{rnd}.log",
                                     self.args.startup_timeout) as server:
                    this["startup_s"] = server.startup_s
                    this["server_rss_mb_after_load"] = server.rss_mb()
                    warm = httpx.post(f"{server.url}/retrieve", json={"queries": qs[:1], "topk": self.args.topk},
                                      timeout=120)
                    warm.raise_for_status()
                    for c in self.args.clients:
                        self.results["loadavg"][f"service/r{rnd}/{name}/{c}"] = loadavg()
                        r, lat = load_test(server, qs, c, self.args.duration, self.args.topk, self.args.warmup_requests)
                        this["clients"][str(c)] = r
                        pooled.setdefault((name, c), []).extend(lat)
                        log(f"  round {rnd} {name:16s} clients={c:3d}: {r['qps']:7.1f} req/s  p50 {r['p50_ms']:8.1f} ms  "
                            f"p99 {r['p99_ms']:8.1f} ms  mean batch {r['server_mean_batch']}  "
                            f"server CPU {r['server_cpu_ms_per_request']} ms/req  errors {r['errors']}")
                        self.save()
                    this["server_peak_rss_mb"] = server.peak_rss_mb()
        for name, v in results["variants"].items():
            v["summary"] = {}
            for c in self.args.clients:
                runs = [rd["clients"][str(c)] for rd in v["rounds"] if str(c) in rd["clients"]]
                lat = pooled.get((name, c), [])
                qps = [x["qps"] for x in runs if x["qps"] is not None]
                v["summary"][str(c)] = {
                    "qps_median": round(float(np.median(qps)), 1) if qps else None,
                    "qps_min": min(qps) if qps else None,
                    "qps_max": max(qps) if qps else None,
                    "p50_ms": round(pct(lat, 50) * 1000, 1),
                    "p99_ms": round(pct(lat, 99) * 1000, 1),
                    "requests": len(lat),
                    "errors": sum(x["errors"] for x in runs),
                    "mean_batch": median_or_none([x["server_mean_batch"] for x in runs]),
                    "server_cpu_ms_per_request": median_or_none([x["server_cpu_ms_per_request"] for x in runs]),
                    "client_cpu_ms_per_request": median_or_none([x["client_cpu_ms_per_request"] for x in runs]),
                }
        self.add_ratios()

    def malformed_stage(self) -> None:
        """Good-request throughput and p99 with and without malformed traffic, alternating rounds on
        one server so both see the same machine load."""
        self.stage_start("malformed")
        import httpx

        a = self.args
        qs = self.questions()
        cfg = SERVICE_VARIANTS["microbatch_w0"]
        res: dict[str, Any] = {"config": cfg, "clients": a.malformed_clients, "duration_s": a.duration,
                               "rounds": a.rounds, "fraction": a.malformed_fraction, "runs": []}
        self.results["malformed"] = res
        pooled: dict[str, list[float]] = {"clean": [], "malformed": []}
        with RetrievalServer(self.index_dir("Flat"), cfg, self.logs / "server-malformed.log",
                             a.startup_timeout) as server:
            httpx.post(f"{server.url}/retrieve", json={"queries": qs[:1], "topk": a.topk}, timeout=120).raise_for_status()
            for rnd in range(a.rounds):
                for label, fraction in (("clean", 0.0), ("malformed", a.malformed_fraction)):
                    self.results["loadavg"][f"malformed/r{rnd}/{label}"] = loadavg()
                    r, lat = load_test(server, qs, a.malformed_clients, a.duration, a.topk, a.warmup_requests,
                                       malformed_fraction=fraction)
                    res["runs"].append({"round": rnd, "label": label, **r})
                    pooled[label].extend(lat)
                    log(f"  round {rnd} {label:9s}: {r['qps']:7.1f} good req/s  p50 {r['p50_ms']:8.1f} ms  "
                        f"p99 {r['p99_ms']:8.1f} ms  good errors {r['errors']}  malformed {r['malformed_answers']}")
                    self.save()
        res["summary"] = {}
        for label in ("clean", "malformed"):
            runs = [x for x in res["runs"] if x["label"] == label]
            answers: dict[str, int] = {}
            for x in runs:
                for k, v in x["malformed_answers"].items():
                    answers[k] = answers.get(k, 0) + v
            res["summary"][label] = {
                "qps_median": median_or_none([x["qps"] for x in runs]),
                "p50_ms": round(pct(pooled[label], 50) * 1000, 1),
                "p99_ms": round(pct(pooled[label], 99) * 1000, 1),
                "good_requests": len(pooled[label]),
                "good_errors": sum(x["errors"] for x in runs),
                "malformed_answers": answers,
                "malformed_5xx": sum(v for k, v in answers.items() if k.rsplit(":", 1)[1].startswith("5")),
            }

    def add_ratios(self) -> None:
        self.results["ratios"] = compute_ratios(self.results)


def compute_ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Throughput ratios between server variants and the in-process baselines of the same threading."""
    svc = results.get("service", {}).get("variants", {})

    def qps(variant: str, c: str) -> float | None:
        return svc.get(variant, {}).get("summary", {}).get(c, {}).get("qps_median")

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    ratios: dict[str, Any] = {}
    for threads, suffix in (("default", ""), ("1thread", "_1thread")):
        inproc = results.get("inprocess", {}).get(threads, {}).get("searcher", {})
        one, b64 = inproc.get("1", {}).get("qps"), inproc.get("64", {}).get("qps")
        mb_name, ser_name = f"microbatch{suffix}", f"serialized{suffix}"
        clients = sorted({c for v in (mb_name, ser_name) for c in svc.get(v, {}).get("summary", {})}, key=int)
        if not clients and not inproc:
            continue
        part: dict[str, Any] = {"inprocess_batch64_over_batch1": ratio(b64, one)}
        for c in clients:
            mb, ser = qps(mb_name, c), qps(ser_name, c)
            part[f"clients_{c}"] = {
                "microbatch_over_serialized": ratio(mb, ser),
                "microbatch_over_inprocess_batch1": ratio(mb, one),
                "microbatch_over_inprocess_batch64": ratio(mb, b64),
                "serialized_over_inprocess_batch1": ratio(ser, one),
            }
            if not suffix and qps("microbatch_w0", c):
                part[f"clients_{c}"]["microbatch_w0_over_serialized"] = ratio(qps("microbatch_w0", c), ser)
        ratios[threads] = part
    return ratios


# --------------------------------------------------------------------------- workers (own process)


def inprocess_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Load the Flat searcher here; time passage encoding, query encoding vs FAISS search, and
    Searcher.search at several batch sizes. Runs in a process of its own (see Bench.inprocess_stage)."""
    import pyarrow.parquet as pq
    import torch

    from ragrl.retrieval.dense import load_faiss_index
    from ragrl.retrieval.encoder import passage_contents
    from ragrl.retrieval.searcher import load_searcher

    bench = Bench(args)
    d, topk = args.inproc_duration, args.topk
    qs = bench.questions()
    t = time.monotonic()
    searcher = load_searcher(bench.index_dir("Flat"))
    res: dict[str, Any] = {"load_s": round(time.monotonic() - t, 2), "torch_threads": torch.get_num_threads(),
                           "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                   "OMP_WAIT_POLICY")},
                           "topk": topk, "questions": len(qs), "loadavg_start": loadavg()}
    enc = searcher.dense.encoder
    log(f"  [worker] searcher loaded in {res['load_s']} s, torch threads {res['torch_threads']}")

    if args.encode_sample > 0:
        # Steady state with the model loaded: separates startup from per-passage cost.
        sample_n = min(args.encode_sample, bench.num_passages())
        table = pq.read_table(bench.passages, columns=["title", "text"]).slice(0, sample_n)
        texts = passage_contents(table)
        enc.encode_passages(texts[:64], show_progress=False)  # warm-up
        t = time.perf_counter()
        enc.encode_passages(texts, show_progress=False)
        secs = time.perf_counter() - t
        res["passage_encode_steady"] = {"passages": sample_n, "seconds": round(secs, 2),
                                        "passages_per_s": round(sample_n / secs, 1)}
        log(f"  [worker] steady-state passage encode: {res['passage_encode_steady']['passages_per_s']} passages/s")
        del table, texts

    # Where a query's time goes: encoding vs FAISS search per index type, batch 1 vs 64.
    parts: dict[str, Any] = {}
    enc.encode_queries(qs[:64])
    parts["encode"] = {str(b): timed_loop(enc.encode_queries, qs, b, min(d, 5)) for b in (1, 64)}
    vecs = enc.encode_queries(qs[: min(len(qs), 1024)])
    for factory in args.factories:
        index = searcher.dense.index if factory == "Flat" else load_faiss_index(bench.index_dir(factory))
        pos = {"n": 0}

        def faiss_search(chunk: list[str], index=index, pos=pos) -> None:
            lo = pos["n"] % len(vecs)
            rows = np.take(vecs, np.arange(lo, lo + len(chunk)), axis=0, mode="wrap")
            pos["n"] += len(chunk)
            index.search(rows, topk)

        index.search(vecs[:64], topk)
        parts[f"faiss_{factory}"] = {"search_params": index.search_params,
                                     **{str(b): timed_loop(faiss_search, qs, b, min(d, 5)) for b in (1, 64)}}
        if factory != "Flat":
            del index
            gc.collect()
    res["parts"] = parts
    for name, p in parts.items():
        log(f"  [worker] {name}: batch 1 {p['1']['ms_per_query']} ms/query, batch 64 {p['64']['ms_per_query']} ms/query")

    # End to end, as the service calls it: encode + search + passage lookup.
    searcher.search(qs[:64], topk)
    res["searcher"] = {}
    for b in args.inproc_batches:
        r = timed_loop(lambda chunk: searcher.search(chunk, topk), qs, b, d)
        res["searcher"][str(b)] = r
        log(f"  [worker] Searcher.search batch {b}: {r['qps']} queries/s, {r['ms_per_call_p50']} ms/call p50, "
            f"{r['ms_per_call_p99']} ms/call p99")
    # Single queries with a 5 ms pause between them: a server at low load sees exactly this.
    r = timed_loop(lambda chunk: (searcher.search(chunk, topk), time.sleep(0.005)), qs, 1, d)
    res["searcher_batch1_with_5ms_gaps"] = r
    log(f"  [worker] Searcher.search batch 1 with 5 ms gaps: {r['ms_per_call_p50']} ms/call p50 "
        f"(includes the 5 ms sleep), p99 {r['ms_per_call_p99']}")
    res["loadavg_end"] = loadavg()
    return res


def bm25q_worker(args: argparse.Namespace) -> dict[str, Any]:
    from ragrl.retrieval.searcher import load_searcher

    bench = Bench(args)
    qs = bench.questions()
    t = time.monotonic()
    searcher = load_searcher(None, bench.out / "index" / "bm25")
    res: dict[str, Any] = {"load_s": round(time.monotonic() - t, 2), "topk": args.topk, "loadavg_start": loadavg()}
    searcher.search(qs[:8], args.topk)
    res["searcher"] = {}
    for b in (1, 64):
        r = timed_loop(lambda chunk: searcher.search(chunk, args.topk), qs, b, args.inproc_duration)
        res["searcher"][str(b)] = r
        log(f"  [worker] BM25 Searcher.search batch {b}: {r['qps']} queries/s")
    res["bm25_only"] = {}
    for b in (1, 64):
        r = timed_loop(lambda chunk: searcher.bm25.search(chunk, args.topk), qs, b, min(args.inproc_duration, 5))
        res["bm25_only"][str(b)] = r
    return res


class RetrievalServer(ServerProcess):
    """`ragrl serve-retriever` on 127.0.0.1 in a subprocess; stopped by its pid."""

    health_poll_s = 0.25

    def __init__(self, index_dir: Path, cfg: dict[str, Any], log_path: Path, startup_timeout: float) -> None:
        super().__init__(log_path, startup_timeout, env=cfg["env"], sample_rss_s=0.2)
        self.index_dir = index_dir
        self.cfg = cfg

    def command(self, host: str, port: int) -> list[str]:
        return ragrl_cmd("serve-retriever", "--index", str(self.index_dir), "--host", host, "--port", str(port),
                         "--max-batch", str(self.cfg["max_batch"]), "--batch-window-ms", str(self.cfg["batch_window_ms"]))


def load_test(server: RetrievalServer, queries: list[str], clients: int, duration: float, topk: int,
              warmup_requests: int, malformed_fraction: float = 0.0) -> tuple[dict[str, Any], list[float]]:
    """`clients` closed-loop threads, each sending one single-query request at a time for `duration` s.

    With `malformed_fraction` > 0 that share of requests (a fixed pseudo-random pattern per client)
    is one of MALFORMED_BODIES instead; their answers are counted by status, and only the good
    requests enter the throughput and latency figures."""
    import random

    import httpx

    loop = ClosedLoop(clients)
    latencies, errors, error_samples = loop.latencies, loop.errors, loop.error_samples
    stride = max(1, len(queries) // clients)
    bad_kinds = list(MALFORMED_BODIES)
    bad_status: dict[str, int] = {}
    bad_lock = threading.Lock()

    def send_malformed(http, rng: random.Random) -> None:
        kind = rng.choice(bad_kinds)
        try:
            code = str(http.post(f"{server.url}/retrieve", content=MALFORMED_BODIES[kind],
                                 headers={"content-type": "application/json"}).status_code)
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        with bad_lock:
            bad_status[f"{kind}:{code}"] = bad_status.get(f"{kind}:{code}", 0) + 1

    def worker(i: int) -> None:
        rng = random.Random(1000 + i)
        with httpx.Client(timeout=120.0) as http:
            j = i * stride
            for _ in range(warmup_requests):  # opens the keep-alive connection, warms the path
                try:
                    http.post(f"{server.url}/retrieve", json={"queries": [queries[j % len(queries)]], "topk": topk})
                except httpx.HTTPError:
                    pass
                j += 1
            deadline = loop.start_line()
            while time.monotonic() < deadline:
                if malformed_fraction and rng.random() < malformed_fraction:
                    send_malformed(http, rng)
                    continue
                q = queries[j % len(queries)]
                j += 1
                t = time.perf_counter()
                try:
                    r = http.post(f"{server.url}/retrieve",
                                  json={"queries": [q], "topk": topk, "return_scores": True})
                    ok = r.status_code == 200 and len(r.json()["result"][0]) == topk
                    if not ok and len(error_samples) < 5:
                        error_samples.append(f"HTTP {r.status_code}: {r.text[:200]}")
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                    ok = False
                    if len(error_samples) < 5:
                        error_samples.append(f"{type(exc).__name__}: {exc}")
                elapsed = time.perf_counter() - t
                if ok:
                    latencies[i].append(elapsed)
                else:
                    errors[i] += 1
            loop.finished(i)

    stats_before: dict[str, Any] = {}
    m = loop.run(worker, server, duration,
                 on_ready=lambda: stats_before.update(server.health().get("batching", {})))
    stats_after = server.health().get("batching", {})
    wall, lat, server_cpu, client_cpu = m["wall_s"], m["latencies"], m["server_cpu_s"], m["client_cpu_s"]
    n = len(lat)
    batches = stats_after.get("batches", 0) - stats_before.get("batches", 0)
    served_queries = stats_after.get("queries", 0) - stats_before.get("queries", 0)
    return {
        "clients": clients,
        "requests": n,
        "errors": sum(errors),
        "error_samples": error_samples,
        "seconds": round(wall, 3),
        "qps": round(n / wall, 1) if wall > 0 else None,
        "p50_ms": round(pct(lat, 50) * 1000, 2),
        "p90_ms": round(pct(lat, 90) * 1000, 2),
        "p99_ms": round(pct(lat, 99) * 1000, 2),
        "max_ms": round(max(lat) * 1000, 2) if lat else None,
        "server_batches": batches,
        "server_mean_batch": round(served_queries / batches, 2) if batches else None,
        "server_largest_batch_ever": stats_after.get("largest_batch_queries"),
        "server_cpu_s": round(server_cpu, 2) if server_cpu is not None else None,
        "server_cpu_ms_per_request": round(server_cpu / n * 1000, 2) if server_cpu is not None and n else None,
        "client_cpu_s": round(client_cpu, 2),
        "client_cpu_ms_per_request": round(client_cpu / n * 1000, 2) if n else None,
        "malformed_fraction": malformed_fraction,
        "malformed_answers": dict(sorted(bad_status.items())),
    }, lat


# --------------------------------------------------------------------------- report


def summary_markdown(r: dict[str, Any]) -> str:
    L: list[str] = []
    m = r.get("machine", {})
    L.append("## Retrieval benchmark")
    L.append("")
    L.append(f"Command: `{r['command']}`  ")
    L.append(f"Machine: {m.get('cpu_count')} CPUs ({m.get('cpu_model')}), {m.get('mem_total_gib')} GiB RAM, "
             f"{m.get('platform')}, versions {m.get('versions')}.  ")
    L.append("Load average (1 min) at stage starts: "
             + ", ".join(f"{k} {v[0]}" for k, v in r.get("loadavg", {}).items() if "/" not in k))
    L.append("")
    if "world" in r:
        w = r["world"]
        L.append(f"World: size `{w['size']}`, seed {w['seed']}: {w['passages']} passages, "
                 f"questions {w['questions']} (generated in {w['wall_s']} s).")
        L.append("")
    if "embed" in r and "passages_per_s" in r["embed"]:
        e = r["embed"]
        L.append(f"### Build ({e['passages']} passages)")
        L.append("")
        L.append(f"Embedding ({e['model']}, batch {e['batch_size']}, max_length {e['max_length']}, "
                 f"{e['num_shards']} shards one after another): {e['wall_s_total']} s, "
                 f"**{e['passages_per_s']} passages/s** end to end (process start + model load included), "
                 f"peak RSS {e['peak_rss_mb_max']} MB per shard process, embeddings {e['embeddings_mb']} MB.")
        cpu = sum(s["cpu_user_s"] + s["cpu_sys_s"] for s in e["shards"])
        L.append(f"CPU time of the shard processes: {cpu:.0f} s, i.e. {e['passages'] / cpu:.1f} passages per "
                 f"CPU-second (wall/CPU = {e['wall_s_total'] / cpu:.2f}; on a 2-core machine an unshared run "
                 f"would approach 0.5).")
        steady = r.get("inprocess", {}).get("default", {}).get("passage_encode_steady")
        if steady:
            L.append(f"Steady-state encode with the model loaded: {steady['passages_per_s']} passages/s "
                     f"({steady['passages']} passages).")
        L.append("")
    if "build" in r:
        L.append("| index | build s (wall) | CPU s | passages/s | peak RSS MB | anon / file-backed peak MB (sampled) "
                 "| index MB | embeddings MB | peak RSS − index MB |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for f, b in r["build"].items():
            L.append(f"| {f} | {b['wall_s']} | {b['cpu_user_s'] + b['cpu_sys_s']:.1f} | {b['passages_per_s']} | "
                     f"{b['peak_rss_mb']} | {b['sampled_peak_rss_anon_mb']} / {b['sampled_peak_rss_file_mb']} | "
                     f"{b['index_mb']} | {b['embeddings_mb']} | {b['peak_rss_minus_index_mb']} |")
        base = r.get("build_import_baseline")
        if base:
            L.append("")
            L.append(f"Import baseline (python + faiss/numpy/pyarrow/ragrl.retrieval.dense, nothing built): "
                     f"peak RSS {base['peak_rss_mb']} MB.")
        L.append("")
    if "bm25_build" in r:
        b = r["bm25_build"]
        L.append(f"BM25 build: {b['wall_s']} s ({b['passages_per_s']} passages/s), peak RSS {b['peak_rss_mb']} MB, "
                 f"index {b['index_mb']} MB.")
        L.append("")
    for name, ip in r.get("inprocess", {}).items():
        L.append(f"### In-process, threads `{name}` (Flat index, model loaded; peak RSS {ip['process']['peak_rss_mb']} MB)")
        L.append("")
        L.append("| part | batch 1: ms/query | batch 64: ms/query |")
        L.append("|---|---:|---:|")
        for part, p in ip["parts"].items():
            L.append(f"| {part} | {p['1']['ms_per_query']} | {p['64']['ms_per_query']} |")
        L.append("")
        L.append("| Searcher.search batch | queries/s | ms/call p50 | ms/call p99 |")
        L.append("|---:|---:|---:|---:|")
        for b, s in ip["searcher"].items():
            L.append(f"| {b} | {s['qps']} | {s['ms_per_call_p50']} | {s['ms_per_call_p99']} |")
        g = ip.get("searcher_batch1_with_5ms_gaps")
        if g:
            L.append(f"| 1, 5 ms pause between calls | {g['qps']} | {g['ms_per_call_p50']} | {g['ms_per_call_p99']} |")
        L.append("")
    svc = r.get("service")
    if svc:
        L.append(f"### Service (Flat, single-query requests, topk {svc['topk']}, {svc['duration_s']} s per setting, "
                 f"{svc['rounds']} round(s))")
        L.append("")
        L.append("| server | clients | req/s (median [min–max]) | p50 ms | p99 ms | mean batch | server CPU ms/req "
                 "| client CPU ms/req | errors |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, v in svc["variants"].items():
            cfg = v["config"]
            env = " ".join(f"{k}={x}" for k, x in cfg["env"].items())
            label = f"{name} (max_batch {cfg['max_batch']}, window {cfg['batch_window_ms']} ms{', ' + env if env else ''})"
            for c, s in v.get("summary", {}).items():
                L.append(f"| {label} | {c} | {s['qps_median']} [{s['qps_min']}–{s['qps_max']}] | {s['p50_ms']} | "
                         f"{s['p99_ms']} | {s['mean_batch']} | {s['server_cpu_ms_per_request']} | "
                         f"{s['client_cpu_ms_per_request']} | {s['errors']} |")
        L.append("")
    rat = r.get("ratios")
    if rat:
        L.append("Ratios (queries/s over queries/s, same run; server variants against the in-process "
                 "baseline with the same threading):")
        L.append("")
        L.append("| threads | clients | micro-batched / serialized | window-0 / serialized | micro-batched / "
                 "in-process batch 1 | micro-batched / in-process batch 64 | serialized / in-process batch 1 |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for threads, part in rat.items():
            for c, row in part.items():
                if c.startswith("clients_"):
                    L.append(f"| {threads} | {c.removeprefix('clients_')} | {row['microbatch_over_serialized']} | "
                             f"{row.get('microbatch_w0_over_serialized', '')} | "
                             f"{row['microbatch_over_inprocess_batch1']} | {row['microbatch_over_inprocess_batch64']} | "
                             f"{row['serialized_over_inprocess_batch1']} |")
        L.append("")
        L.append("In-process batch 64 / batch 1: "
                 + ", ".join(f"{t} {p.get('inprocess_batch64_over_batch1')}" for t, p in rat.items()))
        L.append("")
    bq = r.get("bm25_query")
    if bq:
        L.append("### BM25 queries (in-process)")
        L.append("")
        L.append("| batch | Searcher.search queries/s | ms/query | BM25Index.search only, queries/s |")
        L.append("|---:|---:|---:|---:|")
        for b, s in bq["searcher"].items():
            L.append(f"| {b} | {s['qps']} | {s['ms_per_query']} | {bq.get('bm25_only', {}).get(b, {}).get('qps')} |")
        L.append("")
    mal = r.get("malformed")
    if mal and "summary" in mal:
        L.append(f"### Malformed requests ({mal['clients']} clients, {mal['fraction']:.0%} malformed, "
                 f"{mal['rounds']} x {mal['duration_s']} s per setting, alternating, one server)")
        L.append("")
        L.append("| traffic | good req/s (median) | good p50 ms | good p99 ms | good requests | good errors "
                 "| malformed answered | malformed 5xx |")
        L.append("|---|---:|---:|---:|---:|---:|---|---:|")
        for label, x in mal["summary"].items():
            answers = ", ".join(f"{k} x{v}" for k, v in x["malformed_answers"].items()) or "-"
            L.append(f"| {label} | {x['qps_median']} | {x['p50_ms']} | {x['p99_ms']} | {x['good_requests']} | "
                     f"{x['good_errors']} | {answers} | {x['malformed_5xx']} |")
        L.append("")
    if r.get("failed_stages"):
        L.append(f"**Failed stages:** {r['failed_stages']}")
    return "\n".join(L)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/ragrl-bench"))
    p.add_argument("--size", default="bench", help="world size: tiny | small | medium | bench | N people (default bench)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                   help="stages to run; without `world`, later stages reuse what an earlier run left in --out-dir "
                        "and their figures are merged into its results.json")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size (the workflow's default)")
    p.add_argument("--max-length", type=int, default=256, help="encoder max tokens (the workflow's default)")
    p.add_argument("--factories", nargs="+", default=["Flat", "HNSW32"],
                   help="FAISS factories to build; the service uses Flat (must be first)")
    p.add_argument("--clients", nargs="+", type=int, default=[1, 16, 64])
    p.add_argument("--variants", nargs="+", default=["microbatch", "microbatch_w0", "serialized", "microbatch_1thread",
                                                     "serialized_1thread"],
                   choices=list(SERVICE_VARIANTS))
    p.add_argument("--rounds", type=int, default=1, help="repeat every service variant this often (noisy machines)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per service setting (<= 20 recommended)")
    p.add_argument("--inproc-duration", type=float, default=10.0, help="seconds per in-process measurement")
    p.add_argument("--inproc-batches", nargs="+", type=int, default=[1, 16, 64])
    p.add_argument("--inproc-threads", nargs="+", default=["default", "1thread"], choices=list(THREAD_ENVS))
    p.add_argument("--encode-sample", type=int, default=1024, help="passages for the steady-state encode rate")
    p.add_argument("--warmup-requests", type=int, default=1, help="per client, before each timed setting")
    p.add_argument("--topk", type=int, default=3, help="Search-R1's default retrieval topk")
    p.add_argument("--malformed-clients", type=int, default=64, help="clients in the malformed stage")
    p.add_argument("--malformed-fraction", type=float, default=0.01,
                   help="share of malformed requests in the malformed stage's dirty rounds")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--report-only", action="store_true",
                   help="print (and rewrite) the markdown summary of OUT_DIR/results.json; measure nothing")
    p.add_argument("--worker", choices=["inprocess", "bm25q"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.factories[0] != "Flat":
        p.error("--factories must start with Flat (the service and in-process stages use it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        res = (inprocess_worker if args.worker == "inprocess" else bm25q_worker)(args)
        args.worker_out.write_text(json.dumps(res, indent=2) + "\n")
        return 0
    if args.report_only:
        results_path = args.out_dir / "results.json"
        results = json.loads(results_path.read_text())
        results["ratios"] = compute_ratios(results)
        write_summary(args.out_dir, summary_markdown(results))
        return 0
    bench = Bench(args)
    bench.begin(merge="world" not in args.stages)
    log(f"out dir {bench.out}; stages {args.stages}; machine {bench.results['machine']}")
    stage_fns = {
        "world": bench.world_stage,
        "embed": bench.embed_stage,
        "build": bench.build_stage,
        "bm25": bench.bm25_stage,
        "inprocess": bench.inprocess_stage,
        "service": bench.service_stage,
        "bm25q": bench.bm25q_stage,
        "malformed": bench.malformed_stage,
    }
    failed = bench.run_stages(STAGES, args.stages, stage_fns, fatal=("world", "embed", "build"))
    if "service" in args.stages or "inprocess" in args.stages:
        bench.add_ratios()
    bench.finish(summary_markdown)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
