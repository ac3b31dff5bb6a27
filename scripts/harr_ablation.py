"""HARR variants against the default run's frozen encoders, judged paired (issue #36), and a probe
of what training does to the second hop's ranking.

    .venv/bin/python scripts/harr_ablation.py --run RUN --name lr3e3 \
        --set train.lr=0.003 --set train.steps=12 [--set filter_limit=400 ...] [--types bridge,comparison]

    .venv/bin/python scripts/harr_ablation.py --run RUN --probe [--name lr3e3 ...]

RUN is a finished default run (a `make run` work tree). A variant runs `ragrl harr-filter`,
`harr-train` (history-aware states) and `harr-eval` with the settings the run's own jobs ran
with (read from the first line of `RUN/logs/harr/filter.log`), each `--set key.path=JSON` applied
to the `harr` settings on top, so a variant differs from the default by exactly what it names.
`--types` keeps only training questions of those question types (the toy's `metadata.type`)
before the filter rolls them out; `--kept-from NAME` reuses an earlier variant's filter output and
`--cap TYPE=N` trains on the first N kept questions of a type only (a mix). The summary pairs the variant's test F1 with the run's
`harr_frozen_history` (where training starts) and `harr_frozen` runs over the same 100 questions
(`ragrl.results.paired.paired_bootstrap`), overall and per question type: OUT/<name>/summary.json.

With --probe: for every bridge test question on which the run's `harr_frozen_history` generator
searched twice, the second search's history-aware state (the question, the first hop with its
think, the second query), and where the gold passage of each hop ranks under each encoder: how
often the second hop's passage comes first and the mean score margin s(hop 1) - s(hop 2). The
frozen encoder is probed on the query alone too (what `harr_frozen` sees). `--name` adds the
trained encoders of earlier variants (OUT/<name>/work/final/encoder), `--encoder NAME=PATH` any other
(the run's own: `harr=RUN/results/harr/train/harr/work/final/encoder`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def run_settings(run: Path) -> tuple[dict, dict, str, str]:
    """The recipe and harr settings, recipe name and generator the run's filter job ran with."""
    argv = shlex.split((run / "logs/harr/filter.log").read_text().splitlines()[0].removeprefix("$ "))
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    return json.loads(opt["--recipe"]), json.loads(opt["--harr"]), opt["--recipe-name"], opt["--generator"]


def apply_sets(settings: dict, sets: list[str]) -> dict:
    from ragrl.recipe import HARR_KEYS

    out = json.loads(json.dumps(settings))
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected key.path=JSON")
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise SystemExit(f"--set {item!r}: harr has no section {part!r}")
            node = node[part]
        if leaf not in node and not (node is out and leaf in HARR_KEYS):  # a key newer than the run's log
            raise SystemExit(f"--set {item!r}: harr has no key {key!r}")
        try:
            node[leaf] = json.loads(value)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--set {item!r}: the value is not JSON ({err})") from None
    return out


def variant(args: argparse.Namespace) -> None:
    import polars as pl

    from ragrl.eval.evaluate import question_type
    from rl_ablation import paired_summary

    run = args.run.resolve()
    res = run / "results"
    recipe, harr, recipe_name, generator = run_settings(run)
    harr = apply_sets(harr, args.set)
    out = (args.out / args.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    qa = res / "world/qa/train.parquet"
    if args.types:
        kinds = set(args.types.split(","))
        rows = pl.read_parquet(qa)
        rows.filter(pl.Series([question_type(r) in kinds for r in rows.to_dicts()])).write_parquet(out / "train.parquet")
        qa = out / "train.parquet"
    common = ["--recipe", json.dumps(recipe), "--recipe-name", recipe_name, "--harr", json.dumps(harr),
              "--generator", str(run / generator), "--index", str(res / "index/world/flat"),
              "--passages", str(res / "corpus/world/passages.parquet"), "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    seconds = {}

    def ragrl(stage: str, *extra: str) -> None:
        start = time.time()
        with open(out / f"{stage}.log", "w") as log:
            subprocess.run([str(REPO / ".venv/bin/ragrl"), stage, *common, "--server-log", str(out / f"{stage}.serve.log"),
                            *extra], check=True, stdout=log, stderr=subprocess.STDOUT, cwd=run, env=env)
        seconds[stage] = round(time.time() - start)
        print(f"[harr_ablation] {args.name}: {stage} done in {seconds[stage]} s", flush=True)

    if args.kept_from:
        import shutil

        for suffix in (".parquet", ".stats.json"):
            shutil.copy(args.out / args.kept_from / f"kept{suffix}", out / f"kept{suffix}")
    else:
        ragrl("harr-filter", "--qa", str(qa), "--out", str(out / "kept.parquet"))
    if args.cap:
        caps = {kind: int(n) for kind, n in (item.split("=", 1) for item in args.cap)}
        kept_rows = pl.read_parquet(out / "kept.parquet")
        seen: dict[str, int] = {}
        keep = []
        for r in kept_rows.to_dicts():
            kind = question_type(r)
            seen[kind] = seen.get(kind, 0) + 1
            keep.append(seen[kind] <= caps.get(kind, seen[kind]))
        kept_rows.filter(pl.Series(keep)).write_parquet(out / "kept.parquet")
    ragrl("harr-train", "--qa", str(out / "kept.parquet"), "--history", "--out-dir", str(out / "work"),
          "--log-out", str(out / "train_log.jsonl"))
    ragrl("harr-eval", "--qa", str(res / "world/qa/test.parquet"), "--history", "--encoder", str(out / "work/final/encoder"),
          "--run-id", "harr", "--dataset", "world_test", "--max-questions", "100", "--batch-size", "100",
          "--out", str(out / "eval"))
    kept = json.loads((out / "kept.stats.json").read_text())
    types = [question_type(r) for r in pl.read_parquet(out / "kept.parquet").to_dicts()]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines() if line.strip()]
    preds = out / "eval/predictions.parquet"
    base = res / "harr/eval"
    summary = {"name": args.name, "set": args.set, "types": args.types or None, "kept_from": args.kept_from,
               "cap": args.cap, "seconds": seconds, "kept_by_filter": kept["kept"], "rolled_out": kept["questions"],
               "kept_by_type": {t: types.count(t) for t in sorted(set(types))},
               "train_reward": [round(s["reward_mean"], 3) for s in log],
               "vs_frozen_history": paired_summary(base / "harr_frozen_history/world_test/predictions.parquet", preds, "f1"),
               "vs_frozen": paired_summary(base / "harr_frozen/world_test/predictions.parquet", preds, "f1")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for against in ("vs_frozen_history", "vs_frozen"):
        for label, s in summary[against].items():
            d = s["diff"]
            print(f"{args.name} {against:18s} {label:10s} n={s['n']:3d} F1 {s['sft_mean']:.3f} -> {s['rl_mean']:.3f} "
                  f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")


def probe(args: argparse.Namespace) -> None:
    import faiss
    import numpy as np
    import polars as pl
    from sentence_transformers import SentenceTransformer

    from ragrl.models import resolve_model_path
    from ragrl.retrieval.query_state import history_state, query_only_state

    res = args.run.resolve() / "results"
    meta = json.loads((res / "index/world/flat/meta.json").read_text())
    index = faiss.read_index(str(res / "index/world/flat/index.faiss"))
    vectors = index.reconstruct_n(0, index.ntotal)
    row_of = {pid: i for i, pid in enumerate(pl.read_parquet(res / "corpus/world/passages.parquet")["id"].to_list())}
    qa = {r["id"]: r for r in pl.read_parquet(res / "world/qa/test.parquet").to_dicts()}
    preds = pl.read_parquet(res / "harr/eval/harr_frozen_history/world_test/predictions.parquet")
    cases = []
    for r in preds.filter(pl.col("question_type") == "bridge").iter_rows(named=True):
        think = re.search(r"<think>(.*?)</think>", r["response"], re.S)
        supporting = list(qa[r["id"]]["supporting_ids"])
        if len(r["queries"]) >= 2 and think and len(supporting) == 2:
            cases.append((r["question"], r["queries"][0], think.group(1).strip(), r["queries"][1], supporting))
    print(f"{len(cases)} bridge test questions searched twice by harr_frozen_history's generator")
    encoders = {"frozen": resolve_model_path(meta["model"])}
    encoders |= {name: str(args.out / name / "work/final/encoder") for name in args.name or []}
    encoders |= dict(item.split("=", 1) for item in args.encoder)
    for name, path in encoders.items():
        model = SentenceTransformer(path, device="cpu")
        for kind in ("query only", "history") if name == "frozen" else ("history",):
            states = [query_only_state(q2) if kind == "query only" else
                      history_state(q, [{"sub_query": q1, "answer": think}], q2) for q, q1, think, q2, _ in cases]
            emb = model.encode(states, normalize_embeddings=True)
            first, top2, margins = 0, 0, []
            for (*_, (hop1, hop2)), e in zip(cases, emb):
                scores = vectors @ e
                order = np.argsort(-scores)
                first += int(order[0] == row_of[hop2])
                top2 += int(row_of[hop2] in order[:2])
                margins.append(float(scores[row_of[hop1]] - scores[row_of[hop2]]))
            print(f"{name:24s} {kind:10s} hop-2 passage first {first}/{len(cases)}, in the top 2 {top2}/{len(cases)}, "
                  f"mean s(hop 1) - s(hop 2) {np.mean(margins):+.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished default run's work tree (logs/, results/)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/harr_ablation"))
    ap.add_argument("--name", action="append", help="the variant's name (with --probe: trained variants to probe)")
    ap.add_argument("--set", action="append", default=[], help="harr key.path=JSON, repeatable")
    ap.add_argument("--types", default="", help="comma-separated question types to train on (default: all)")
    ap.add_argument("--kept-from", help="reuse the filter output of an earlier variant (OUT/<name>/kept.parquet)")
    ap.add_argument("--cap", action="append", default=[],
                    help="TYPE=N: train on the first N kept questions of that type only (types not named: "
                         "all kept, unlike harr.train_mix, which drops them), repeatable")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--encoder", action="append", default=[], help="with --probe: NAME=PATH of another encoder to probe")
    args = ap.parse_args()
    if args.probe:
        probe(args)
        return
    if not args.name or len(args.name) != 1:
        raise SystemExit("--name: one variant name")
    args.name = args.name[0]
    variant(args)


if __name__ == "__main__":
    main()
