#!/usr/bin/env python
"""Benchmark AutoGraph-R1's inference parts: `construct_kg` passages/s and PPR passage-ranking queries/s.

A benchmark, not a test: it asserts nothing about speed, it measures and reports. Run it from the
repository root with the project's environment, e.g.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_graph.py --out-dir /tmp/ragrl-bench-graph \
        --model /work/ci-run/results/models/pretrained

Stages (each heavy step in a process of its own, so each peak RSS is that step's alone):

  world      `ragrl world --size bench --seed 0` (40,000 people: ~116k passages, ~319k facts),
             or `--world DIR` to reuse one.
  construct  `ragrl construct-kg` (ragrl.kg.construct) with the tiny policy (`--model`, default the
             workflow's results/models/pretrained), greedy, max 256 tokens per passage, on a fixed
             random sample of `--construct-passages` world passages, once per `--batches` size
             (fresh work dir each time, so nothing is resumed), in the order given. passages/s is
             construction.json's (generation loop only: model load and imports excluded); the
             command's wall and CPU time and peak RSS are reported beside it. The outputs of every
             batch size are compared with the first run's (greedy decoding with left padding
             should not change them), and their tokens counted with the policy's tokenizer
             (generated tokens/s). Baseline: the smallest batch size. The runs are sequential, so
             a change of load between them moves the ratios: run `--batches 32 8 1` too.
  ppr        a worker process: the corpus-level GOLD graph of the world (`ragrl.kg.text_graph.
             build_graph` over every passage's true triples, `constructor.gold_triples_by_passage`
             of kg/B/triples.parquet, the KG the gold constructor SFT reads), its scipy adjacency
             (`ppr_matrix`), then HippoRAG 2's passage ranking per question of a fixed sample of
             the QA test split, split into parts:
               query embed   MiniLM (`Encoder("sentence-transformers/all-MiniLM-L6-v2")`), one
                             question per call
               score+top10   float32 triple matrix @ query, `top_indices(scores, 10)`
               PPR           reset vector as `rank_passages` builds it, `personalized_pagerank`
                             on the prebuilt adjacency (damping 0.85, tol 1e-10)
               rank          passages by PageRank mass (lexsort, unreached left out)
             Triple embedding is a one-off cost, timed separately. At 100-400 triples/s on two
             cores the 319k triples take 15-50 min, so by default only the triples of
             `--embed-passages` passages are embedded: every sampled question's supporting
             passages plus random others. The other rows of the triple matrix are zero, so the
             matrix product has the full size and cost, but the top-10 is drawn from the embedded
             triples only (recall is therefore optimistic: distractor triples of the other
             passages are no candidates). `--embed-passages 0` embeds every triple.
             Also timed: `rank_passages` itself as the reward calls it (it rebuilds the triple
             text list, the float64 vectors and the adjacency on every call; the embedder here
             returns cached triple vectors, otherwise every call would re-embed the whole graph)
             on `--library-queries` questions, and checked against the split path.
             Baseline: `networkx.pagerank` (same alpha, tol, personalisation, weights) on the same
             graph (an undirected nx.Graph from the same adjacency, built once) for
             `--nx-queries` of the questions; PageRank vectors and top-5 passages compared.

Results: OUT_DIR/results.json (rewritten after every stage) and a markdown summary on stdout and
in OUT_DIR/summary.md. The machine is assumed shared and noisy: load averages are recorded;
compare ratios measured in the same run rather than absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib.py sits next to this script
from benchlib import (  # noqa: E402
    MB,
    BenchRun,
    loadavg,
    log,
    ragrl_cmd,
    rss_mb,
    run_measured,
    set_log_tag,
    write_summary,
)

set_log_tag("bench-graph")
STAGES = ("world", "construct", "ppr")
VERSIONS_OF = ("torch", "transformers", "sentence-transformers", "numpy", "scipy", "networkx", "pyarrow")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


# --------------------------------------------------------------------------- helpers


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=root)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/ragrl/kg", "src/ragrl/agent"],
                               capture_output=True, text=True, timeout=10, cwd=root).stdout.strip()
        if out.returncode != 0:
            return None
        return out.stdout.strip() + (" (src/ragrl/kg or agent modified)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    x = a / b
    return round(x, 1) if x >= 10 else round(x, 2)


def ms_stats(values: list[float]) -> dict[str, float]:
    """mean / median / p90 of seconds, in ms."""
    if not values:
        return {}
    a = np.asarray(values) * 1000
    return {"mean_ms": round(float(a.mean()), 2), "p50_ms": round(float(np.median(a)), 2),
            "p90_ms": round(float(np.percentile(a, 90)), 2), "n": len(values)}


class Clock:
    """Wall and process-CPU seconds of a block (CPU seconds are what a loaded machine does not inflate)."""

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c


# --------------------------------------------------------------------------- construct_kg


def construct_outputs(work: Path) -> dict[str, str]:
    """passage id -> raw model output, from a construct-kg work directory's part files."""
    import pyarrow.parquet as pq

    out: dict[str, str] = {}
    for part in sorted((work / "parts").glob("part-*.parquet")):
        for r in pq.read_table(part).to_pylist():
            out[r["passage_id"]] = r["output"]
    return out


# --------------------------------------------------------------------------- the PPR worker


def ppr_worker(args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from scipy.sparse import triu

    from ragrl.kg.constructor import gold_triples_by_passage
    from ragrl.kg.text_graph import (
        PPR_DAMPING,
        TOP_TRIPLES,
        build_graph,
        passage_ranking,
        personalized_pagerank,
        ppr_matrix,
        rank_passages,
        reset_vector,
        top_indices,
    )
    from ragrl.retrieval.encoder import Encoder
    from ragrl.rewards.autograph import recall_at_k

    world = Path(args.world)
    res: dict[str, Any] = {"loadavg_start": loadavg(), "kg": args.kg}

    # The graph: every passage's true triples.
    with Clock() as c_read:
        rows = pq.read_table(world / "kg" / args.kg / "triples.parquet",
                             columns=["head", "relation", "tail", "source_id"]).to_pylist()
        gold = gold_triples_by_passage(rows)
    with Clock() as c_build:
        g = build_graph(gold.items())
    with Clock() as c_adj:
        adj = ppr_matrix(g)
    n_world_passages = pq.read_metadata(world / "passages.parquet").num_rows
    pairs = int(triu(adj).nnz)
    res["graph"] = {
        "kg_rows": len(rows), "entity_nodes": len(g.entities), "passage_nodes": len(g.passages),
        "world_passages": n_world_passages, "nodes": g.n_nodes, "unique_triples": len(g.triples),
        "source_edges": int(g.source_entity.size), "edges": len(g.triples) + int(g.source_entity.size),
        "adjacency_nnz": int(adj.nnz), "distinct_node_pairs": pairs,
        "read_group_s": round(c_read.wall, 2), "build_graph_s": round(c_build.wall, 2),
        "ppr_matrix_s": round(c_adj.wall, 3), **rss_mb(),
    }
    gi = res["graph"]
    log(f"  [worker] gold graph: {gi['nodes']:,} nodes ({gi['entity_nodes']:,} entities, {gi['passage_nodes']:,} "
        f"passages of {n_world_passages:,}), {gi['unique_triples']:,} triples + {gi['source_edges']:,} source edges "
        f"({pairs:,} distinct node pairs, nnz {adj.nnz:,}); read {c_read.wall:.1f} s, build {c_build.wall:.1f} s, "
        f"adjacency {c_adj.wall:.2f} s; RSS {gi['rss_mb']} MB")
    del rows

    # Questions: a fixed sample of the test split whose supporting passages are graph nodes.
    qa = pq.read_table(world / "qa" / f"{args.qa_split}.parquet",
                       columns=["id", "question", "supporting_ids"]).to_pylist()
    passage_index = {p: i for i, p in enumerate(g.passages)}
    qa = [q for q in qa if q["supporting_ids"] and all(s in passage_index for s in q["supporting_ids"])]
    rng = random.Random(args.seed)
    queries = rng.sample(qa, min(args.queries, len(qa)))
    res["queries"] = {"split": args.qa_split, "eligible": len(qa), "sampled": len(queries),
                      "mean_supporting": round(statistics.mean(len(q["supporting_ids"]) for q in queries), 2)}

    # Which triples get embedded: those of the supporting passages plus random others.
    from ragrl.kg.extraction import unique_triples

    key_index = {t.key(): i for i, t in enumerate(g.triples)}
    if args.embed_passages <= 0 or args.embed_passages >= len(g.passages):
        chosen = list(g.passages)
    else:
        support = {s for q in queries for s in q["supporting_ids"]}
        others = [p for p in g.passages if p not in support]
        fill = max(0, args.embed_passages - len(support))
        chosen = sorted(support) + rng.sample(others, min(fill, len(others)))
    embed_idx = sorted({key_index[t.key()] for p in chosen for t in unique_triples(gold[p])})
    texts = [g.triples[i].text() for i in embed_idx]

    with Clock() as c_load:
        enc = Encoder(MINILM, batch_size=args.embed_batch)
    with Clock() as c_emb:
        emb = enc.encode_queries(texts)
    per_s = len(texts) / c_emb.wall
    vectors = np.zeros((len(g.triples), enc.dim), dtype=np.float32)
    vectors[embed_idx] = emb
    del emb
    res["triple_embedding"] = {
        "model": MINILM, "batch_size": args.embed_batch, "encoder_load_s": round(c_load.wall, 2),
        "passages": len(chosen), "triples": len(texts), "share_of_graph": round(len(texts) / len(g.triples), 4),
        "mean_chars": round(statistics.mean(map(len, texts)), 1),
        "wall_s": round(c_emb.wall, 2), "cpu_s": round(c_emb.cpu, 2), "triples_per_s": round(per_s, 1),
        "full_graph_estimate_s": round(len(g.triples) / per_s, 1), "vectors_mb": round(vectors.nbytes / MB, 1),
        **rss_mb(),
    }
    log(f"  [worker] embedded {len(texts):,} triples of {len(chosen):,} passages in {c_emb.wall:.1f} s "
        f"({per_s:.0f} triples/s; all {len(g.triples):,} would take ~{len(g.triples) / per_s:.0f} s)")

    def ranked(rank: np.ndarray) -> list[str]:
        return list(passage_ranking(g, rank).passage_ids)

    # Warm-up (first calls allocate, import, fill caches); not timed.
    for q in queries[:3]:
        qv = enc.encode_queries([q["question"]])[0]
        s = vectors @ qv
        personalized_pagerank(adj, reset_vector(g, s, top_indices(s, TOP_TRIPLES)), PPR_DAMPING)

    parts: dict[str, list[float]] = {"query_embed": [], "score_top10": [], "ppr": [], "rank": [], "total": []}
    cpu_total: list[float] = []
    recall5, recall2, kept = [], [], []
    start_load = loadavg()
    t_loop = time.perf_counter()
    for q in queries:
        c0 = time.process_time()
        t0 = time.perf_counter()
        qv = enc.encode_queries([q["question"]])[0]
        t1 = time.perf_counter()
        scores = vectors @ qv
        top = top_indices(scores, TOP_TRIPLES)
        t2 = time.perf_counter()
        reset = reset_vector(g, scores, top)
        rank = personalized_pagerank(adj, reset, PPR_DAMPING)
        t3 = time.perf_counter()
        order = ranked(rank)
        t4 = time.perf_counter()
        cpu_total.append(time.process_time() - c0)
        for k, v in zip(("query_embed", "score_top10", "ppr", "rank", "total"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3,
                                                                                  t4 - t0)):
            parts[k].append(v)
        recall5.append(recall_at_k(order, q["supporting_ids"], 5))
        recall2.append(recall_at_k(order, q["supporting_ids"], 2))
        kept.append({"reset": reset, "top": top, "order5": order[:5], "ppr_s": t3 - t2, "question": q["question"]})
    loop_s = time.perf_counter() - t_loop
    n = len(queries)
    totals = parts["total"]
    res["per_query"] = {
        "queries": n, "loop_s": round(loop_s, 2), "loadavg_before": start_load, "loadavg_after": loadavg(),
        "parts": {k: ms_stats(v) for k, v in parts.items()},
        "cpu_ms_mean": round(1000 * statistics.mean(cpu_total), 2),
        "queries_per_s": round(n / sum(totals), 2),
        "ppr_rank_per_s": round(n / (sum(parts["ppr"]) + sum(parts["rank"])), 2),
        "share": {k: round(sum(v) / sum(totals), 3) for k, v in parts.items() if k != "total"},
        "recall_at_5": round(statistics.mean(recall5), 3), "recall_at_2": round(statistics.mean(recall2), 3),
        **rss_mb(),
    }
    pq_ = res["per_query"]
    log(f"  [worker] {n} queries: {pq_['queries_per_s']} q/s end to end; per query "
        + ", ".join(f"{k} {v['mean_ms']} ms" for k, v in pq_["parts"].items())
        + f"; recall@5 {pq_['recall_at_5']}")

    # rank_passages as the reward calls it, with the triple vectors cached in the embedder.
    lib_times, lib_agree = [], 0
    lib_queries = kept[:args.library_queries]
    for item in lib_queries:
        def cached(texts_: list[str], _q=item["question"]) -> np.ndarray:
            if len(texts_) != len(g.triples) + 1:
                raise RuntimeError("rank_passages asked for other texts than question + every triple")
            return np.vstack([enc.encode_queries([texts_[0]]), vectors])

        with Clock() as c_lib:
            ranking = rank_passages(g, item["question"], cached)
        lib_times.append(c_lib.wall)
        lib_agree += list(ranking.passage_ids[:5]) == item["order5"]
    res["rank_passages"] = {"queries": len(lib_queries), **ms_stats(lib_times),
                            "queries_per_s": round(len(lib_times) / sum(lib_times), 3) if lib_times else None,
                            "top5_same_as_split_path": lib_agree, **rss_mb()}
    if lib_times:
        log(f"  [worker] rank_passages (cached triple vectors): {res['rank_passages']['mean_ms']} ms per query; "
            f"top-5 same as the split path on {lib_agree}/{len(lib_times)}")

    # Baseline: networkx.pagerank on the same graph and reset vectors.
    nx_res: dict[str, Any] = {"queries": min(args.nx_queries, n)}
    if args.nx_queries > 0:
        import networkx as nx

        with Clock() as c_nx:
            G = nx.from_scipy_sparse_array(adj, edge_attribute="weight")
        nx_res.update(graph_build_s=round(c_nx.wall, 2), nx_nodes=G.number_of_nodes(), nx_edges=G.number_of_edges(),
                      **rss_mb())
        log(f"  [worker] networkx graph built in {c_nx.wall:.1f} s ({G.number_of_edges():,} edges); "
            f"RSS {nx_res['rss_mb']} MB")
        nx_times, ours_times, diffs, same5 = [], [], [], 0
        for item in kept[:args.nx_queries]:
            reset = item["reset"]
            with Clock() as c_pr:
                pr = nx.pagerank(G, alpha=PPR_DAMPING, personalization={i: float(v) for i, v in enumerate(reset)
                                                                       if v > 0},
                                 weight="weight", tol=1e-10, max_iter=1000)
            nx_times.append(c_pr.wall)
            theirs = np.array([pr.get(i, 0.0) for i in range(g.n_nodes)])
            with Clock() as c_ours:
                ours = personalized_pagerank(adj, reset, PPR_DAMPING)
            ours_times.append(c_ours.wall)
            diffs.append(float(np.abs(theirs - ours).max()))
            same5 += ranked(theirs)[:5] == item["order5"]
        nx_res.update(ppr=ms_stats(nx_times), ours_same_queries=ms_stats(ours_times),
                      max_abs_diff=max(diffs), top5_same=same5,
                      speedup_ppr=ratio(statistics.median(nx_times), statistics.median(ours_times)))
        # End to end with networkx's PPR in place of ours (the other parts as measured above).
        other = (sum(parts["query_embed"]) + sum(parts["score_top10"]) + sum(parts["rank"])) / n
        nx_res["queries_per_s_with_nx"] = round(1 / (other + statistics.mean(nx_times)), 3)
        nx_res["speedup_end_to_end"] = ratio(pq_["queries_per_s"], nx_res["queries_per_s_with_nx"])
        nx_res["peak_rss_mb"] = rss_mb()["peak_rss_mb"]
        log(f"  [worker] networkx.pagerank {nx_res['ppr']['mean_ms']} ms vs ours "
            f"{nx_res['ours_same_queries']['mean_ms']} ms on the same {len(nx_times)} resets "
            f"({nx_res['speedup_ppr']}x); max |diff| {max(diffs):.2e}; top-5 same {same5}/{len(nx_times)}")
    res["networkx"] = nx_res
    res["loadavg_end"] = loadavg()
    return res


# --------------------------------------------------------------------------- the run


class Bench(BenchRun):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, args.out_dir, VERSIONS_OF, git_commit=_git_commit())
        self.world = Path(args.world).resolve() if args.world else self.out / "world"

    def world_stage(self) -> None:
        self.stage_start("world")
        if self.args.world:
            log(f"  --world given: using {self.world}, no world generated")
            manifest = json.loads((self.world / "manifest.json").read_text())
            self.results["world"] = {"reused": str(self.world), "passages": manifest.get("passages"),
                                     "facts": manifest.get("facts")}
            return
        m, manifest = self.generate_world(self.world)
        self.results["world"] = {**m, "size": self.args.size, "seed": self.args.seed, "people": manifest.get("people"),
                                 "entities": manifest.get("entities"), "facts": manifest.get("facts"),
                                 "passages": manifest.get("passages")}

    def construct_stage(self) -> None:
        import pyarrow.parquet as pq

        self.stage_start("construct")
        a = self.args
        cdir = self.out / "construct"
        cdir.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(self.world / "passages.parquet")
        rng = random.Random(a.seed)
        rows = sorted(rng.sample(range(table.num_rows), min(a.construct_passages, table.num_rows)))
        sample = cdir / "sample.parquet"
        pq.write_table(table.take(rows), sample)
        res: dict[str, Any] = {"model": str(a.model), "passages": len(rows), "max_turn_tokens": a.max_turn_tokens,
                               "temperature": 0.0, "runs": []}
        self.results["construct"] = res
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.model)
        reference: dict[str, str] | None = None
        for b in a.batches:
            out, work = cdir / f"batch{b}", cdir / f"batch{b}.work"
            for d in (out, work):
                if d.exists():
                    shutil.rmtree(d)
            m = run_measured(ragrl_cmd("construct-kg", "--passages", str(sample), "--model", str(a.model),
                                       "--out", str(out), "--work", str(work), "--batch-size", str(b),
                                       "--max-turn-tokens", str(a.max_turn_tokens), "--temperature", "0"),
                             self.logs / f"construct-batch{b}.log")
            stats = json.loads((out / "construction.json").read_text())
            outputs = construct_outputs(work)
            tokens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in outputs.values()]
            if reference is None:
                reference = outputs
            same = sum(outputs.get(k) == v for k, v in reference.items())
            gen_s = stats["generated_now"] / stats["passages_per_s"] if stats.get("passages_per_s") else None
            run = {"batch": b, "passages_per_s": stats.get("passages_per_s"),
                   "generation_s": round(gen_s, 2) if gen_s else None,
                   "generated_tokens": sum(tokens), "mean_tokens": round(statistics.mean(tokens), 1),
                   "max_tokens": max(tokens), "tokens_per_s": round(sum(tokens) / gen_s, 1) if gen_s else None,
                   "triples": stats.get("triples"), "invalid_passages": stats.get("invalid_passages"),
                   "invalid_reasons": stats.get("invalid_reasons"), "outputs_same_as_first": same,
                   "command": m, "loadavg_after": loadavg()}
            res["runs"].append(run)
            log(f"  batch {b:3d}: {run['passages_per_s']} passages/s ({run['tokens_per_s']} generated tokens/s, "
                f"mean {run['mean_tokens']} tokens), command wall {m['wall_s']} s, peak RSS {m['peak_rss_mb']} MB; "
                f"invalid {run['invalid_passages']}/{len(rows)}; outputs same as the first run's: {same}/{len(rows)}")
            self.save()
        baseline = min(res["runs"], key=lambda run: run["batch"])
        res["baseline_batch"] = baseline["batch"]
        for run in res["runs"]:
            run["over_baseline"] = ratio(run["passages_per_s"], baseline["passages_per_s"])

    def ppr_stage(self) -> None:
        self.stage_start("ppr")
        a = self.args
        out_json = self.out / "ppr.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "ppr", "--worker-out", str(out_json),
               "--world", str(self.world), "--out-dir", str(self.out), "--kg", a.kg, "--qa-split", a.qa_split,
               "--queries", str(a.queries), "--embed-passages", str(a.embed_passages),
               "--embed-batch", str(a.embed_batch), "--library-queries", str(a.library_queries),
               "--nx-queries", str(a.nx_queries), "--seed", str(a.seed)]
        m = run_measured(cmd, self.logs / "ppr.log")
        self.results["ppr"] = {**json.loads(out_json.read_text()), "worker_process": m}


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
    L.append("## AutoGraph-R1 benchmark: construct_kg and PPR")
    L.append("")
    L.append(f"Command: `{r['command']}`  ")
    L.append(f"Started {r.get('started')}, commit {r.get('git_commit')}; machine: {m.get('cpu_count')} CPUs "
             f"({m.get('cpu_model')}), {m.get('mem_total_gib')} GiB, versions {m.get('versions')}.  ")
    L.append("Load average (1/5/15 min) at stage starts: "
             + "; ".join(f"{k} {v}" for k, v in r.get("loadavg", {}).items()))
    L.append("")
    w = r.get("world")
    if w:
        if "reused" in w:
            L.append(f"World: reused {w['reused']} ({w.get('passages')} passages, {w.get('facts')} facts).")
        else:
            L.append(f"World: `ragrl world --size {w['size']} --seed {w['seed']}`: {w['passages']:,} passages, "
                     f"{w['facts']:,} facts; {w['wall_s']} s, peak RSS {w['peak_rss_mb']} MB.")
        L.append("")
    c = r.get("construct")
    if c and c.get("runs"):
        L.append(f"### construct_kg: {c['passages']} sampled passages, greedy, ≤ {c['max_turn_tokens']} tokens, "
                 f"model {c['model']}")
        L.append("")
        L.append("| batch (in run order) | passages/s | **/ batch " + str(c.get("baseline_batch"))
                 + "** | generation s | generated tokens (mean / max) | tokens/s | command wall / CPU s "
                 "| peak RSS MB | invalid | outputs same |")
        L.append("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        for run in c["runs"]:
            cmd = run["command"]
            L.append(f"| {run['batch']} | {run['passages_per_s']} | **{run.get('over_baseline')}×** | "
                     f"{run['generation_s']} | {run['generated_tokens']:,} "
                     f"({run['mean_tokens']} / {run['max_tokens']}) | "
                     f"{run['tokens_per_s']} | {cmd['wall_s']} / {cmd['cpu_s']} | {cmd['peak_rss_mb']} | "
                     f"{run['invalid_passages']} | "
                     f"{run['outputs_same_as_first']}/{c['passages']} |")
        L.append("")
    p = r.get("ppr")
    if p:
        gi, te, q = p["graph"], p["triple_embedding"], p["per_query"]
        L.append(f"### PPR over the gold graph (kg/{p['kg']}): {gi['nodes']:,} nodes "
                 f"({gi['entity_nodes']:,} entities + {gi['passage_nodes']:,} passages), {gi['edges']:,} edges "
                 f"({gi['unique_triples']:,} triples + {gi['source_edges']:,} source edges; "
                 f"{gi['distinct_node_pairs']:,} distinct node pairs)")
        L.append("")
        L.append(f"build_graph {gi['build_graph_s']} s, ppr_matrix {gi['ppr_matrix_s']} s. Triple embedding (once): "
                 f"{te['triples']:,} triples ({te['share_of_graph']:.1%} of the graph, {te['passages']:,} passages) in "
                 f"{te['wall_s']} s = {te['triples_per_s']} triples/s; all triples ≈ "
                 f"{te['full_graph_estimate_s']} s.")
        L.append("")
        L.append(f"Per query ({q['queries']} questions): **{q['queries_per_s']} q/s** end to end, "
                 f"{q['ppr_rank_per_s']} q/s PPR + ranking alone; recall@5 {q['recall_at_5']}, @2 {q['recall_at_2']}.")
        L.append("")
        L.append("| part | mean ms | p50 ms | p90 ms | share |")
        L.append("|---|---:|---:|---:|---:|")
        for k, v in q["parts"].items():
            L.append(f"| {k} | {v['mean_ms']} | {v['p50_ms']} | {v['p90_ms']} | {q['share'].get(k, 1.0):.0%} |")
        L.append("")
        lib = p.get("rank_passages", {})
        if lib.get("queries"):
            L.append(f"`rank_passages` as called (cached triple vectors): {lib['mean_ms']} ms per query "
                     f"({lib['queries_per_s']} q/s), top-5 same as the split path {lib['top5_same_as_split_path']}/"
                     f"{lib['queries']}.")
            L.append("")
        nx_ = p.get("networkx", {})
        if nx_.get("ppr"):
            L.append(f"networkx.pagerank on the same graph ({nx_['queries']} resets; nx.Graph build "
                     f"{nx_['graph_build_s']} s once): {nx_['ppr']['mean_ms']} ms vs ours "
                     f"{nx_['ours_same_queries']['mean_ms']} ms per PPR → **{nx_['speedup_ppr']}×**; end to end "
                     f"{nx_['queries_per_s_with_nx']} vs {q['queries_per_s']} q/s ({nx_['speedup_end_to_end']}×); "
                     f"max |Δ| {nx_['max_abs_diff']:.1e}, top-5 same {nx_['top5_same']}/{nx_['queries']}.")
            L.append("")
        L.append(f"Worker peak RSS {p['worker_process']['peak_rss_mb']} MB.")
        L.append("")
    if r.get("failed_stages"):
        L.append(f"**Failed stages:** {r['failed_stages']}")
    return "\n".join(L)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out-dir", type=Path, default=Path("/tmp/ragrl-bench-graph"))
    p.add_argument("--world", default=None, help="an existing world directory instead of generating one")
    p.add_argument("--size", default="bench", help="world size (default bench: 40,000 people)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    p.add_argument("--model", default="results/models/pretrained",
                   help="the constructor (default: the workflow's tiny policy, results/models/pretrained)")
    p.add_argument("--construct-passages", type=int, default=256)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32],
                   help="batch sizes, run in this order; the smallest is the baseline")
    p.add_argument("--max-turn-tokens", type=int, default=256)
    p.add_argument("--kg", default="B", choices=["A", "B"], help="the world KG whose triples make the gold graph")
    p.add_argument("--qa-split", default="test")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--embed-passages", type=int, default=4000,
                   help="passages whose triples are embedded (questions' supporting ones first); 0: all")
    p.add_argument("--embed-batch", type=int, default=64)
    p.add_argument("--library-queries", type=int, default=3, help="questions timed through rank_passages itself")
    p.add_argument("--nx-queries", type=int, default=5, help="questions for the networkx.pagerank baseline")
    p.add_argument("--report-only", action="store_true", help="print the summary of OUT_DIR/results.json")
    p.add_argument("--worker", choices=["ppr"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        res = ppr_worker(args)
        args.worker_out.write_text(json.dumps(res, indent=2) + "\n")
        return 0
    if args.report_only:
        write_summary(args.out_dir, summary_markdown(json.loads((args.out_dir / "results.json").read_text())))
        return 0
    bench = Bench(args)
    bench.begin(merge="world" not in args.stages)
    log(f"out dir {bench.out}; world {bench.world}; stages {args.stages}")
    fns = {"world": bench.world_stage, "construct": bench.construct_stage, "ppr": bench.ppr_stage}
    failed = bench.run_stages(STAGES, args.stages, fns, fatal=("world",))
    bench.finish(summary_markdown)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
