"""HARR variants against the default run's frozen encoders, judged paired (issue #36), and a probe
of what training does to the second hop's ranking.

    .venv/bin/python scripts/harr_ablation.py --run RUN --name lr3e3 \
        --set train.lr=0.003 --set train.steps=12 [--set 'train_mix={"bridge":null}' ...] [--kept-from NAME]

    .venv/bin/python scripts/harr_ablation.py --run RUN --probe [--name lr3e3 ...]

RUN is a finished default run (a `make run` work tree). A variant runs `ragrl harr-filter`,
`harr-train` (history-aware states) and `harr-eval` with the settings the run's own jobs ran
with (read from the first line of `RUN/logs/harr/filter.log`), each `--set key.path=JSON` applied
to the `harr` settings on top, so a variant differs from the default by exactly what it names
(`ragrl` checks every key). `--kept-from NAME` skips the filter and trains on an earlier variant's
filter output, cut to this variant's `train_mix` as the filter stage cuts its own
(`ragrl.stages.harr.mix_kept`: e.g. the first 12 1-hop questions and every multi-hop one of a
filter over all types). The summary pairs the variant's test F1 with the run's
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
import re
import shlex
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


def variant(args: argparse.Namespace) -> None:
    import polars as pl

    from ragrl.eval.evaluate import question_type
    from ragrl.recipe import parse_harr
    from ragrl.stages.harr import mix_kept
    from rl_ablation import apply_sets, paired_summary, run as run_logged

    run = args.run.resolve()
    res = run / "results"
    recipe, harr, recipe_name, generator = run_settings(run)
    harr = apply_sets(harr, args.set)
    out = (args.out / args.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = ["--recipe", json.dumps(recipe), "--recipe-name", recipe_name, "--harr", json.dumps(harr),
              "--generator", str(run / generator), "--index", str(res / "index/world/flat"),
              "--passages", str(res / "corpus/world/passages.parquet"), "--threads", "1"]
    seconds = {}

    def ragrl(stage: str, *extra: str) -> None:
        start = time.time()
        run_logged([str(REPO / ".venv/bin/ragrl"), stage, *common, "--server-log", str(out / f"{stage}.serve.log"),
                    *extra], out / f"{stage}.log", run)
        seconds[stage] = round(time.time() - start)
        print(f"[harr_ablation] {args.name}: {stage} done in {seconds[stage]} s", flush=True)

    if args.kept_from:
        # The earlier filter's output, cut to this variant's train_mix by the stage's own rule.
        earlier = args.out / args.kept_from
        rows = pl.read_parquet(earlier / "kept.parquet")
        ids = mix_kept(rows.to_dicts(), set(rows["id"].cast(pl.String).to_list()), parse_harr(harr).train_mix)
        rows.filter(pl.col("id").cast(pl.String).is_in(sorted(ids))).write_parquet(out / "kept.parquet")
        (out / "kept.stats.json").write_text((earlier / "kept.stats.json").read_text())
    else:
        ragrl("harr-filter", "--qa", str(res / "world/qa/train.parquet"), "--out", str(out / "kept.parquet"))
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
    summary = {"name": args.name, "set": args.set, "kept_from": args.kept_from, "seconds": seconds, "kept_by_filter": kept["kept"], "rolled_out": kept["questions"],
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
    ap.add_argument("--kept-from", help="train on an earlier variant's filter output (OUT/<name>/kept.parquet), "
                                        "cut to this variant's train_mix")
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
