#!/usr/bin/env python
"""Benchmark the KG server: store load/build, KG-R1's four ops in process and over HTTP, vs a linear scan.

A benchmark, not a test: it asserts nothing about speed, it measures and reports. Run it from the
repository root with the project's environment, e.g.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_kg.py --out-dir /tmp/ragrl-bench-kg          # ~1.0M triples
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_kg.py --quick --out-dir /tmp/ragrl-bench-kg-q  # ~80k, ~1 min

The KG is KG A of a synthetic world (`ragrl world --size N`): about 8 triples per person, so the
default 126,000 people give ~1.0M triples over ~312k entities (people, places, organisations,
works, and literal nodes such as years). `--kg-dir` reuses any triples directory instead.

Stages (each heavy step in a process of its own, so each peak RSS is that step's alone):

  world      `ragrl world --size SIZE` (wall, peak RSS from os.wait4)
  inprocess  a worker process: the store built step by step as `load_kg` does it (parquet read +
             dictionary encoding + CSR, entities table attached, each lookup index built), RSS after
             each step; then ops/s for each of the 4 ops, four ways:
               csr      KGStore.relations_out/... on integer ids (the adjacency alone)
               execute  ragrl.kg.ops.execute(store, op, [entity, relation]): names in, the model's
                        message out (resolution with case/alias fallbacks, suggestions on misses,
                        sorted and capped listings)
               scan     baseline: numpy boolean masks over the 1M-row int32 head/relation/tail
                        columns; names resolved by a plain dict, results mapped back to names
                        and sorted (what a naive implementation does)
               scan_ids the same masks on integer ids (compare with csr)
               arrow    baseline: pyarrow.compute filters over the string columns (no encoding)
             plus `store.resolve(name)` alone, and KGService.retrieve (the function behind
             POST /retrieve) on a mixed list of all 4 ops at batch 1 and 32.
  http       `ragrl serve-kg` on 127.0.0.1 (ephemeral port, stopped by pid): startup until
             /health answers, RSS; closed-loop client threads (KGClient, keep-alive), each POSTing
             BATCH items of the same mixed list, for 1 and 8 clients.

Queries: entities drawn from random triples (so degree-weighted: a hub such as a birth year is
drawn as often as it occurs), relations from the same triple; a share `--miss-rate` are misses:
an unknown entity name (a real name with a suffix, so suggestions are computed) or, for the
entity ops, a relation the entity does not have in that direction. The in-process worker checks
that execute() and both scans agree on a sample before timing.

Results: OUT_DIR/results.json (rewritten after every stage) and a markdown summary on stdout and
in OUT_DIR/summary.md. The machine is assumed shared and noisy: load averages are recorded, and
compare ratios measured in the same run rather than absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
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
    rss_mb,
    run_measured,
    set_log_tag,
    write_summary,
)

set_log_tag("bench-kg")
STAGES = ("world", "inprocess", "http")
OPS = ("get_relations_out", "get_relations_in", "get_entities_out", "get_entities_in")
DEFAULT_SIZE = "126000"  # people -> ~1.0M KG triples
VERSIONS_OF = ("numpy", "pyarrow", "fastapi", "uvicorn", "httpx")


# --------------------------------------------------------------------------- helpers


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/ragrl/kg"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + (" (src/ragrl/kg modified)" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def rate(fn: Callable[..., Any], items: list[tuple], duration: float, per_call: int = 1,
         warmup: int = 10) -> dict[str, Any]:
    """Call fn(*item) over `items` (cycling) for `duration` s; ops/s where one call does `per_call` ops."""
    for item in items[:warmup]:
        fn(*item)
    n, i, m = 0, 0, len(items)
    clock = time.perf_counter
    start = clock()
    while True:
        fn(*items[i])
        i = i + 1 if i + 1 < m else 0
        n += 1
        elapsed = clock() - start
        if elapsed >= duration:
            break
    ops = n * per_call
    return {"ops": ops, "calls": n, "seconds": round(elapsed, 3), "ops_per_s": round(ops / elapsed, 1),
            "us_per_op": round(elapsed / ops * 1e6, 2)}


def ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    x = a / b
    return round(x, 1) if x >= 10 else round(x, 2)


# --------------------------------------------------------------------------- the linear-scan baseline


class LinearScan:
    """The four ops answered by scanning all triples each time: numpy boolean masks over the int32
    columns (names to ids through a dict, results back to sorted names), or Arrow filters over the
    string columns. Exact names only; a miss is an empty result (no suggestions)."""

    def __init__(self, heads: np.ndarray, rels: np.ndarray, tails: np.ndarray, entity_names: list[str],
                 relation_names: list[str], table=None) -> None:
        self.h, self.r, self.t = heads, rels, tails
        self.names = np.asarray(entity_names, dtype=object)
        self.rel_names = np.asarray(relation_names, dtype=object)
        self.ent_ids: dict[str, list[int]] = {}
        for i, name in enumerate(entity_names):
            self.ent_ids.setdefault(name, []).append(i)
        self.rel_ids = {name: i for i, name in enumerate(relation_names)}
        self.table = table

    # ids in, ids out (compare with the CSR adjacency)
    def relations_out_ids(self, e: int) -> np.ndarray:
        return np.unique(self.r[self.h == e])

    def relations_in_ids(self, e: int) -> np.ndarray:
        return np.unique(self.r[self.t == e])

    def entities_out_ids(self, e: int, r: int) -> np.ndarray:
        return self.t[(self.h == e) & (self.r == r)]

    def entities_in_ids(self, e: int, r: int) -> np.ndarray:
        return self.h[(self.t == e) & (self.r == r)]

    # names in, sorted names out (compare with ops.execute)
    def _mask(self, col: np.ndarray, entity: str) -> np.ndarray | None:
        ids = self.ent_ids.get(entity)
        if not ids:
            return None
        return col == ids[0] if len(ids) == 1 else np.isin(col, ids)

    @staticmethod
    def _sorted(names) -> list[str]:
        return sorted(set(names), key=lambda s: (s.casefold(), s))

    def relations(self, entity: str, direction: str) -> list[str]:
        mask = self._mask(self.h if direction == "out" else self.t, entity)
        if mask is None:
            return []
        return self._sorted(self.rel_names[np.unique(self.r[mask])].tolist())

    def entities(self, entity: str, relation: str, direction: str) -> list[str]:
        rid = self.rel_ids.get(relation)
        mask = self._mask(self.h if direction == "out" else self.t, entity)
        if mask is None or rid is None:
            return []
        other = self.t if direction == "out" else self.h
        return self._sorted(self.names[np.unique(other[mask & (self.r == rid)])].tolist())

    def run(self, op: str, entity: str, relation: str | None = None) -> list[str]:
        direction = "out" if op.endswith("_out") else "in"
        if op.startswith("get_relations"):
            return self.relations(entity, direction)
        return self.entities(entity, relation, direction)

    # strings only: what filtering the parquet table directly costs
    def run_arrow(self, op: str, entity: str, relation: str | None = None) -> list[str]:
        import pyarrow.compute as pc

        tb = self.table
        key, other = ("head", "tail") if op.endswith("_out") else ("tail", "head")
        mask = pc.equal(tb[key], entity)
        if op.startswith("get_relations"):
            return self._sorted(pc.unique(tb["relation"].filter(mask)).to_pylist())
        mask = pc.and_(mask, pc.equal(tb["relation"], relation))
        return self._sorted(pc.unique(tb[other].filter(mask)).to_pylist())


# --------------------------------------------------------------------------- queries


def draw_queries(store, n: int, miss_rate: float, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Per op, `n` queries: {"entity", "relation", "eid", "rid", "miss"}; ids are None for unknown names."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    m = store.num_triples
    for op in OPS:
        direction = "out" if op.endswith("_out") else "in"
        ent_col = store.heads if direction == "out" else store.tails
        adj = store.out if direction == "out" else store.inc
        rows = nrng.integers(0, m, size=n)
        qs = []
        for k, row in enumerate(rows.tolist()):
            e, r = int(ent_col[row]), int(store.rels[row])
            name = store.entity_names[e]
            q = {"entity": name, "relation": store.relation_names[r], "eid": e, "rid": r, "miss": None}
            if rng.random() < miss_rate:
                if op.startswith("get_relations") or rng.random() < 0.5:
                    q.update(entity=_unknown_name(store, name, rng), eid=None, rid=None, miss="entity")
                else:
                    absent = sorted(set(range(store.num_relations)) - set(adj.relations(e).tolist()))
                    if absent:
                        r = rng.choice(absent)
                        q.update(relation=store.relation_names[r], rid=r, miss="relation")
            if op.startswith("get_relations"):
                q.update(relation=None, rid=None)
            qs.append(q)
        out[op] = qs
    return out


def _unknown_name(store, name: str, rng: random.Random) -> str:
    for _ in range(100):
        candidate = f"{name} {rng.choice('QXZJ')}{rng.randrange(10, 99)}"
        if not store.resolve(candidate).ids:
            return candidate
    raise RuntimeError(f"could not make an unknown name from {name!r}")


def mixed_requests(queries: dict[str, list[dict[str, Any]]], dataset: str, seed: int) -> list[dict[str, Any]]:
    """All ops interleaved, in KG-R1's request shape."""
    reqs = [{"action_type": op, "dataset_name": dataset, "sample_id": None, "entity_id": q["entity"],
             "relation": q["relation"]} for op, qs in queries.items() for q in qs]
    random.Random(seed).shuffle(reqs)
    return reqs


# --------------------------------------------------------------------------- the in-process worker


def inprocess_worker(args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from ragrl.kg.ops import execute
    from ragrl.kg.server import KGService
    from ragrl.kg.store import _LOOKUP_INDEXES, KGSource, _attach_entities, _world_layout, load_triples_parquet

    kg_dir = Path(args.kg_dir)
    triples = kg_dir / "triples.parquet"
    res: dict[str, Any] = {"kg_dir": str(kg_dir), "loadavg_start": loadavg()}
    steps: dict[str, Any] = {"imports": {"s": None, **rss_mb()}}

    # The store, step by step as load_kg(dir, "whole") builds it.
    t = time.perf_counter()
    store = load_triples_parquet(triples)
    steps["read_encode_csr"] = {"s": round(time.perf_counter() - t, 3), **rss_mb()}
    entities, kb_column, _ = _world_layout(kg_dir)
    if entities is not None:
        t = time.perf_counter()
        store = _attach_entities(store, entities, kb_column)
        steps["attach_entities"] = {"s": round(time.perf_counter() - t, 3), **rss_mb()}
    for name in _LOOKUP_INDEXES:
        t = time.perf_counter()
        getattr(store, name)
        steps[f"index{name}"] = {"s": round(time.perf_counter() - t, 3), **rss_mb()}
    total = sum(s["s"] for s in steps.values() if s["s"] is not None)
    arrays = [store.heads, store.rels, store.tails, store.out.indptr, store.out.rel, store.out.nbr,
              store.inc.indptr, store.inc.rel, store.inc.nbr]
    res["store"] = {**store.info(), "load_s_total": round(total, 2), "steps": steps, **rss_mb(),
                    "array_mb": round(sum(a.nbytes for a in arrays) / MB, 1)}
    log(f"  [worker] {store!r} built in {total:.2f} s; RSS {res['store']['rss_mb']} MB, "
        f"peak {res['store']['peak_rss_mb']} MB; steps " + ", ".join(f"{k} {v['s']}" for k, v in steps.items()))

    # The baseline's own "load": the string table (for arrow) and the dict name -> ids.
    t = time.perf_counter()
    table = pq.read_table(triples, columns=["head", "relation", "tail"])
    arrow_read_s = time.perf_counter() - t
    t = time.perf_counter()
    scan = LinearScan(store.heads, store.rels, store.tails, store.entity_names, store.relation_names, table)
    res["scan_setup"] = {"arrow_read_s": round(arrow_read_s, 3), "name_dict_s": round(time.perf_counter() - t, 3),
                         "rows": int(table.num_rows), **rss_mb()}

    queries = draw_queries(store, args.queries, args.miss_rate, args.seed)
    reqs = mixed_requests(queries, kg_dir.name, args.seed)
    Path(args.worker_queries).write_text(json.dumps(reqs))
    res["queries"] = {"per_op": args.queries, "miss_rate": args.miss_rate,
                      "misses": {op: sum(q["miss"] is not None for q in qs) for op, qs in queries.items()}}

    # Agreement on a sample: the timed implementations must answer the same thing.
    agree: dict[str, Any] = {}
    for op, qs in queries.items():
        bad, checked, statuses, totals = [], 0, {}, []
        for q in qs[: args.check]:
            r = execute(store, op, [q["entity"], q["relation"]][: 1 if op.startswith("get_relations") else 2])
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
            s = scan.run(op, q["entity"], q["relation"])
            a = scan.run_arrow(op, q["entity"], q["relation"])
            ok = s == a and (r.total == len(s) and list(r.results) == s[: len(r.results)] if r.ok else not s)
            if q["eid"] is not None:
                if op == "get_relations_out":
                    c, b = store.relations_out(q["eid"]), scan.relations_out_ids(q["eid"])
                elif op == "get_relations_in":
                    c, b = store.relations_in(q["eid"]), scan.relations_in_ids(q["eid"])
                elif op == "get_entities_out":
                    c, b = store.entities_out(q["eid"], q["rid"]), scan.entities_out_ids(q["eid"], q["rid"])
                else:
                    c, b = store.entities_in(q["eid"], q["rid"]), scan.entities_in_ids(q["eid"], q["rid"])
                ok = ok and np.array_equal(np.sort(c), np.sort(b))
            checked += 1
            if r.ok:
                totals.append(r.total)
            if not ok and len(bad) < 3:
                bad.append({"query": {k: q[k] for k in ("entity", "relation", "miss")}, "status": r.status.value,
                            "op_total": r.total, "scan": s[:10], "scan_len": len(s)})
        agree[op] = {"checked": checked, "disagree": bad, "statuses": statuses,
                     "mean_results_when_found": round(float(np.mean(totals)), 1) if totals else None,
                     "max_results_when_found": max(totals) if totals else None}
        if bad:
            log(f"  [worker] DISAGREEMENT in {op}: {bad}")
    res["agreement"] = agree
    log(f"  [worker] agreement checked on {args.check} queries per op: "
        + ", ".join(f"{op} {'ok' if not a['disagree'] else 'MISMATCH'}" for op, a in agree.items()))

    d = args.duration
    per_op: dict[str, Any] = {}
    for op, qs in queries.items():
        rel_op = op.startswith("get_relations")
        named = [(op, q["entity"], q["relation"]) for q in qs]
        ids = [(q["eid"],) if rel_op else (q["eid"], q["rid"]) for q in qs if q["eid"] is not None]
        csr_fn = {"get_relations_out": store.relations_out, "get_relations_in": store.relations_in,
                  "get_entities_out": store.entities_out, "get_entities_in": store.entities_in}[op]
        scan_fn = {"get_relations_out": scan.relations_out_ids, "get_relations_in": scan.relations_in_ids,
                   "get_entities_out": scan.entities_out_ids, "get_entities_in": scan.entities_in_ids}[op]
        args_of = (lambda o, e, r: [e]) if rel_op else (lambda o, e, r: [e, r])
        row = {
            "csr": rate(csr_fn, ids, d),
            "execute": rate(lambda o, e, r: execute(store, o, args_of(o, e, r)), named, d),
            "scan": rate(scan.run, named, d),
            "scan_ids": rate(scan_fn, ids, d),
            "arrow": rate(scan.run_arrow, named, min(d, max(1.0, d / 2)), warmup=2),
        }
        row["execute_over_scan"] = ratio(row["execute"]["ops_per_s"], row["scan"]["ops_per_s"])
        row["csr_over_scan_ids"] = ratio(row["csr"]["ops_per_s"], row["scan_ids"]["ops_per_s"])
        row["execute_over_arrow"] = ratio(row["execute"]["ops_per_s"], row["arrow"]["ops_per_s"])
        per_op[op] = row
        log(f"  [worker] {op}: " + ", ".join(f"{k} {v['ops_per_s']}/s" for k, v in row.items() if isinstance(v, dict)))
    res["ops"] = per_op

    # Name resolution alone (every op starts with it).
    hits = [(q["entity"],) for q in queries["get_relations_out"] if q["eid"] is not None]
    misses = [(q["entity"],) for qs in queries.values() for q in qs if q["miss"] == "entity"]
    res["resolve"] = {"hit": rate(store.resolve, hits, min(d, 2.0))}
    if misses:
        res["resolve"]["miss"] = rate(store.resolve, misses, min(d, 2.0))
        res["suggest_miss"] = rate(lambda name: store.suggest(name, 5), misses, min(d, 2.0))

    # The function behind POST /retrieve, in process, on the mixed list the HTTP stage sends.
    service = KGService({kg_dir.name: KGSource(kg_dir.name, store)})
    mixed: dict[str, Any] = {"scan": rate(lambda q: scan.run(q["action_type"], q["entity_id"], q["relation"]),
                                          [(q,) for q in reqs], d)}
    for b in args.batches:
        chunks = [(reqs[i : i + b],) for i in range(0, len(reqs) - b + 1, b)]
        mixed[f"service_batch{b}"] = rate(service.retrieve, chunks, d, per_call=b, warmup=2)
    res["mixed"] = mixed
    log("  [worker] mixed list: " + ", ".join(f"{k} {v['ops_per_s']}/s" for k, v in mixed.items()))
    res["process"] = rss_mb()
    res["loadavg_end"] = loadavg()
    return res


# --------------------------------------------------------------------------- HTTP


class KGServer(ServerProcess):
    """`ragrl serve-kg` on 127.0.0.1 in a subprocess; stopped by its pid."""

    def __init__(self, kg_dir: Path, log_path: Path, startup_timeout: float) -> None:
        super().__init__(log_path, startup_timeout)
        self.kg_dir = kg_dir

    def command(self, host: str, port: int) -> list[str]:
        return ragrl_cmd("serve-kg", "--kg", str(self.kg_dir), "--host", host, "--port", str(port))


def load_test(server: KGServer, reqs: list[dict[str, Any]], batch: int, clients: int,
              duration: float) -> dict[str, Any]:
    """`clients` closed-loop threads, each POSTing `batch` items of `reqs` at a time for `duration` s."""
    from ragrl.kg.client import KGClient, KGServiceError

    loop = ClosedLoop(clients)
    stride = max(batch, len(reqs) // clients)

    def worker(i: int) -> None:
        with KGClient(server.url, timeout=120.0, retries=0, batch_size=batch) as client:
            j = i * stride

            def chunk() -> list[dict[str, Any]]:
                nonlocal j
                out = [reqs[(j + k) % len(reqs)] for k in range(batch)]
                j += batch
                return out

            client.retrieve(chunk())  # opens the keep-alive connection
            deadline = loop.start_line()
            while time.monotonic() < deadline:
                items = chunk()
                t = time.perf_counter()
                try:
                    client.retrieve(items)
                    loop.latencies[i].append(time.perf_counter() - t)
                except KGServiceError as exc:
                    loop.errors[i] += 1
                    if len(loop.error_samples) < 5:
                        loop.error_samples.append(str(exc)[:300])
            loop.finished(i)

    m = loop.run(worker, server, duration)
    wall, lat, server_cpu, client_cpu = m["wall_s"], m["latencies"], m["server_cpu_s"], m["client_cpu_s"]
    n = len(lat)
    ops = n * batch
    return {
        "batch": batch, "clients": clients, "requests": n, "ops": ops, "errors": sum(loop.errors),
        "error_samples": loop.error_samples, "seconds": round(wall, 3),
        "ops_per_s": round(ops / wall, 1) if wall > 0 else None,
        "requests_per_s": round(n / wall, 1) if wall > 0 else None,
        "p50_ms": round(pct(lat, 50) * 1000, 2), "p99_ms": round(pct(lat, 99) * 1000, 2),
        "server_cpu_us_per_op": round(server_cpu / ops * 1e6, 1) if server_cpu is not None and ops else None,
        "client_cpu_us_per_op": round(client_cpu / ops * 1e6, 1) if ops else None,
        "loadavg": loadavg(),
    }


# --------------------------------------------------------------------------- the run


class Bench(BenchRun):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, args.out_dir, VERSIONS_OF, git_commit=_git_commit())
        self.world = self.out / "world"
        self.kg_dir = Path(args.kg_dir).resolve() if args.kg_dir else self.world / "kg" / "A"
        self.queries_path = self.out / "queries.json"

    def world_stage(self) -> None:
        self.stage_start("world")
        if self.args.kg_dir:
            log(f"  --kg-dir given: using {self.kg_dir}, no world generated")
            return
        m, manifest = self.generate_world(self.world)
        self.results["world"] = {**m, "size": self.args.size, "seed": self.args.seed,
                                 "people": manifest["people"], "entities": manifest["entities"],
                                 "facts": manifest["facts"], "passages": manifest["passages"],
                                 "triples_parquet_mb": round((self.kg_dir / "triples.parquet").stat().st_size / MB, 1)}

    def inprocess_stage(self) -> None:
        self.stage_start("inprocess")
        out_json = self.out / "inprocess.json"
        a = self.args
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "inprocess", "--worker-out", str(out_json),
               "--worker-queries", str(self.queries_path), "--kg-dir", str(self.kg_dir), "--out-dir", str(self.out),
               "--duration", str(a.duration), "--queries", str(a.queries), "--miss-rate", str(a.miss_rate),
               "--seed", str(a.seed), "--check", str(a.check), "--batches", *map(str, a.batches)]
        m = run_measured(cmd, self.logs / "inprocess.log")
        self.results["inprocess"] = {**json.loads(out_json.read_text()), "worker_process": m}

    def http_stage(self) -> None:
        self.stage_start("http")
        if not self.queries_path.exists():
            raise RuntimeError(f"{self.queries_path} missing: run the inprocess stage first")
        reqs = json.loads(self.queries_path.read_text())
        a = self.args
        res: dict[str, Any] = {"duration_s": a.http_duration, "rounds": a.rounds, "runs": []}
        self.results["http"] = res
        for rnd in range(a.rounds):
            with KGServer(self.kg_dir, self.logs / f"serve-kg-r{rnd}.log", a.startup_timeout) as server:
                info = {"round": rnd, "startup_s": server.startup_s, **rss_mb(server.proc.pid), "settings": []}
                res["runs"].append(info)
                for b in a.batches:
                    for c in a.clients:
                        r = load_test(server, reqs, b, c, a.http_duration)
                        info["settings"].append(r)
                        log(f"  round {rnd} batch {b:3d} clients {c:2d}: {r['ops_per_s']:8.1f} ops/s "
                            f"({r['requests_per_s']} req/s), p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
                            f"server CPU {r['server_cpu_us_per_op']} us/op, client CPU {r['client_cpu_us_per_op']} "
                            f"us/op, errors {r['errors']}")
                        self.save()
                info["server_after"] = rss_mb(server.proc.pid)
        # Median over rounds per setting.
        summary = {}
        for b in a.batches:
            for c in a.clients:
                runs = [s for run in res["runs"] for s in run["settings"] if s["batch"] == b and s["clients"] == c]
                summary[f"{b}x{c}"] = {
                    "batch": b, "clients": c,
                    "ops_per_s": round(float(np.median([s["ops_per_s"] for s in runs])), 1),
                    "ops_per_s_all": [s["ops_per_s"] for s in runs],
                    "p50_ms": round(float(np.median([s["p50_ms"] for s in runs])), 2),
                    "p99_ms": round(float(np.median([s["p99_ms"] for s in runs])), 2),
                    "server_cpu_us_per_op": median_or_none([s["server_cpu_us_per_op"] for s in runs], 1),
                    "client_cpu_us_per_op": median_or_none([s["client_cpu_us_per_op"] for s in runs], 1),
                    "errors": sum(s["errors"] for s in runs),
                }
        res["summary"] = summary
        mixed = self.results.get("inprocess", {}).get("mixed", {})
        scan = mixed.get("scan", {}).get("ops_per_s")
        for row in summary.values():
            row["over_scan"] = ratio(row["ops_per_s"], scan)
            inproc = mixed.get(f"service_batch{row['batch']}", {}).get("ops_per_s")
            row["over_inprocess_same_batch"] = ratio(row["ops_per_s"], inproc)


# --------------------------------------------------------------------------- report


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x >= 100:
        return f"{x:,.0f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def summary_markdown(r: dict[str, Any]) -> str:
    L: list[str] = []
    m = r.get("machine", {})
    L.append("## KG server benchmark")
    L.append("")
    L.append(f"Command: `{r['command']}`  ")
    L.append(f"Started {r.get('started')}, commit {r.get('git_commit')}; machine: {m.get('cpu_count')} CPUs ({m.get('cpu_model')}), "
             f"{m.get('mem_total_gib')} GiB, versions {m.get('versions')}.  ")
    L.append("Load average (1/5/15 min) at stage starts: "
             + "; ".join(f"{k} {v}" for k, v in r.get("loadavg", {}).items()))
    L.append("")
    w = r.get("world")
    if w:
        L.append(f"World: `ragrl world --size {w['size']} --seed {w['seed']}`: {w['people']:,} people, "
                 f"{w['entities']:,} world entities, {w['facts']:,} facts, {w['passages']:,} passages; "
                 f"{w['wall_s']} s, peak RSS {w['peak_rss_mb']} MB; KG A triples.parquet {w['triples_parquet_mb']} MB.")
        L.append("")
    ip = r.get("inprocess")
    if ip:
        s = ip["store"]
        L.append(f"### Store: {s['triples']:,} triples, {s['entities']:,} entities, {s['relations']} relations")
        L.append("")
        L.append("| step (as `load_kg` does it) | s | RSS after, MB |")
        L.append("|---|---:|---:|")
        for k, v in s["steps"].items():
            L.append(f"| {k} | {_fmt(v['s'])} | {v['rss_mb']} |")
        L.append(f"| **total** | **{s['load_s_total']}** | peak {s['peak_rss_mb']} |")
        L.append("")
        L.append(f"numpy arrays (triples + both CSR directions): {s['array_mb']} MB. "
                 f"Linear-scan baseline setup: parquet string table read {ip['scan_setup']['arrow_read_s']} s, "
                 f"name dict {ip['scan_setup']['name_dict_s']} s.")
        L.append("")
        q = ip["queries"]
        L.append(f"### In-process ops/s ({q['per_op']} queries per op, {q['miss_rate']:.0%} misses; "
                 f"{r['args']['duration']} s per cell)")
        L.append("")
        L.append("| op | execute() names→message | linear scan numpy, names | arrow filter, strings "
                 "| **execute / scan** | execute / arrow | CSR ids | scan ids | **CSR / scan (ids)** | mean results |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for op, row in ip["ops"].items():
            ag = ip["agreement"][op]
            L.append(f"| {op} | {_fmt(row['execute']['ops_per_s'])} | {_fmt(row['scan']['ops_per_s'])} | "
                     f"{_fmt(row['arrow']['ops_per_s'])} | **{row['execute_over_scan']}×** | "
                     f"{row['execute_over_arrow']}× | {_fmt(row['csr']['ops_per_s'])} | "
                     f"{_fmt(row['scan_ids']['ops_per_s'])} | **{row['csr_over_scan_ids']}×** | "
                     f"{ag['mean_results_when_found']} |")
        L.append("")
        rs = ip.get("resolve", {})
        parts = [f"`store.resolve(name)` {rs['hit']['ops_per_s']:,.0f}/s on hits ({rs['hit']['us_per_op']} µs)"]
        if "miss" in rs:
            parts.append(f"{rs['miss']['ops_per_s']:,.0f}/s on misses ({rs['miss']['us_per_op']} µs)")
        if "suggest_miss" in ip:
            parts.append(f"`store.suggest` on misses {ip['suggest_miss']['us_per_op']} µs")
        L.append("; ".join(parts) + ".")
        bad = {op: a["disagree"] for op, a in ip["agreement"].items() if a["disagree"]}
        L.append(f"Agreement check (execute vs numpy scan vs arrow scan, CSR vs scan on ids), "
                 f"{ip['agreement'][OPS[0]]['checked']} queries per op: "
                 + ("all agree." if not bad else f"**MISMATCHES** {bad}"))
        L.append("")
    h = r.get("http")
    if h and h.get("summary"):
        run0 = h["runs"][0]
        L.append(f"### HTTP: `ragrl serve-kg`, mixed list of the 4 ops ({h['duration_s']} s per setting, "
                 f"{h['rounds']} round(s), median shown)")
        L.append("")
        L.append(f"Server startup until /health answers: {', '.join(str(x['startup_s']) for x in h['runs'])} s; "
                 f"RSS after startup {run0['rss_mb']} MB, after the load tests "
                 f"{run0.get('server_after', {}).get('rss_mb')} MB (peak {run0.get('server_after', {}).get('peak_rss_mb')}).")
        L.append("")
        mixed = ip.get("mixed", {}) if ip else {}
        L.append("| batch per POST | clients | ops/s | p50 ms | p99 ms | server CPU µs/op | client CPU µs/op "
                 "| **/ linear scan** | / in-process same batch | errors |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in h["summary"].values():
            L.append(f"| {row['batch']} | {row['clients']} | {_fmt(row['ops_per_s'])} | {row['p50_ms']} | "
                     f"{row['p99_ms']} | {row['server_cpu_us_per_op']} | {row['client_cpu_us_per_op']} | "
                     f"**{row['over_scan']}×** | {row['over_inprocess_same_batch']}× | {row['errors']} |")
        L.append("")
        if mixed:
            L.append("Same mixed list in process: " + ", ".join(
                f"{k.replace('_', ' ')} {_fmt(v['ops_per_s'])} ops/s" for k, v in mixed.items()) + ".")
            L.append("")
    if r.get("failed_stages"):
        L.append(f"**Failed stages:** {r['failed_stages']}")
    return "\n".join(L)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/ragrl-bench-kg"))
    p.add_argument("--quick", action="store_true",
                   help="a small world (size medium, ~80k triples) and short timings: about a minute")
    p.add_argument("--size", default=None, help=f"world size in people or a preset (default {DEFAULT_SIZE}: ~1.0M triples)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kg-dir", default=None, help="an existing KG dir (triples.parquet) instead of generating a world")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    p.add_argument("--duration", type=float, default=None, help="seconds per in-process cell (default 4, quick 0.5)")
    p.add_argument("--http-duration", type=float, default=None, help="seconds per HTTP setting (default 10, quick 2)")
    p.add_argument("--queries", type=int, default=None, help="queries drawn per op (default 2000, quick 500)")
    p.add_argument("--miss-rate", type=float, default=0.1)
    p.add_argument("--check", type=int, default=None, help="queries per op checked for agreement (default 300)")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 8])
    p.add_argument("--rounds", type=int, default=None, help="HTTP rounds, each with a fresh server (default 2, quick 1)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--report-only", action="store_true", help="print the summary of OUT_DIR/results.json")
    p.add_argument("--worker", choices=["inprocess"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--worker-queries", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = {"size": ("medium", DEFAULT_SIZE), "duration": (0.5, 4.0), "http_duration": (2.0, 10.0),
                "queries": (500, 2000), "check": (100, 300), "rounds": (1, 2)}
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        res = inprocess_worker(args)
        args.worker_out.write_text(json.dumps(res, indent=2) + "\n")
        return 0
    if args.report_only:
        write_summary(args.out_dir, summary_markdown(json.loads((args.out_dir / "results.json").read_text())))
        return 0
    bench = Bench(args)
    bench.begin(merge="world" not in args.stages)
    log(f"out dir {bench.out}; KG {bench.kg_dir}; stages {args.stages}")
    fns = {"world": bench.world_stage, "inprocess": bench.inprocess_stage, "http": bench.http_stage}
    failed = bench.run_stages(STAGES, args.stages, fns, fatal=("world",))
    bench.finish(summary_markdown)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
