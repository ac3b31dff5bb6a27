"""RL ablations against the SFT start, judged paired (issue #35): what holds an agent's RL back.

    .venv/bin/python scripts/rl_ablation.py --results RUN/results --method search_r1 \
        --name t06_ret05 --set rollout.temperature=0.6 --set reward.retrieval=0.5 [--set rl.steps=16 ...]

    .venv/bin/python scripts/rl_ablation.py --results RUN/results --method search_r1 --diagnose \
        --set rollout.temperature=0.6 [--questions 48 --group 8]

RUN is a finished default run (a `make run` work tree): its SFT model
(`results/models/<method>/sft_merged`), flat index, QA splits and the SFT run's test predictions
are what every variant starts from and is compared with. The recipe is the default config's
(config/config.yaml), with each `--set key.path=JSON` applied on top, so a variant differs from
the default by exactly what it names.

Without --diagnose: RL from the SFT model (`ragrl rl`), merge, evaluation on world_test (greedy,
as the DAG's), then the paired difference against the SFT run over the same 100 questions
(`ragrl.results.paired.paired_bootstrap`), overall and per question type, searches per question,
and the training reward's first and last quarter; written to OUT/<name>/summary.json and printed.

With --sft-set key.path=JSON (repeatable): first a new cold start, `ragrl sft` on the run's own SFT
data with the recipe's `sft` section changed (e.g. --sft-set sft.epochs=6), merged and evaluated, then
RL from that start; the summary pairs the new SFT with the run's SFT and the RL with the new SFT.

With --decision: the continue-or-answer decision the SFT model makes, teacher-forced on the run's own
gold SFT trajectories: at the point after the first observation where the gold thought goes on with
"Next I need to find out" or closes with "So the answer is" (`ragrl.toy.gold`), the probability of
going on (of the two first tokens), by question type. Greedy decoding goes on where it is above 0.5.

What RL and the cold start train on, and where RL starts (a variant's inputs, without a copy of RUN):
--train-qa FILE (RL's questions instead of RUN's world_train: a mix, or questions SFT never saw),
--sft-data FILE (with --sft-set: the new start's SFT data instead of RUN's), --start DIR (RL from an
earlier variant's new start, DIR/sft_merged, paired against DIR/sft_eval), and --train-questions N
(the start and the RL model also evaluated greedily on the first N questions of --train-qa: what RL
does on the questions it trains on).

With --from-logs: the same for any agent method (kg_r1 included), from the run's own logged
commands instead (the first line of logs/rl/<method>.log, logs/merge/<method>_rl.log and
logs/eval/<method>_rl.log: `--recipe` patched by each --set, outputs moved to OUT/<name>), the RL
evaluated on every dataset the run evaluated it on and paired with the run's SFT on each.

With --sampled K: what RL optimises, on held-out questions. The run's SFT and RL models (and each
--extra NAME=DIR, e.g. OUT/<name>/merged) evaluated K times with the run's logged evaluation
command at the recipe's rollout temperature (`ragrl eval --temperature recipe --seed k`, k = 0..K-1),
each question's EM averaged over its K samples, each model paired with the SFT per dataset. Greedy
EM (the tables') can stay level while the sampled policy RL trains improves, or the other way.
And where RL's samples reach: of the questions the SFT model answers wrong greedily, how many it
answers right in any of its K samples (all on-policy RL can reinforce there), of those it answers
right, how many its samples rarely do, and each model's greedy gains and losses against the SFT
with the SFT's sampled success on those questions (OUT/<name>_sampled/summary.json, "headroom").

With --diagnose: G sampled rollouts per training question with the SFT model at the recipe's
temperature, and per question type the success rate (EM), the share of rollouts by number of
searches with each one's success rate, and how many groups hold any success or tie. This is what
GRPO will see: e.g. at temperature 1.0 only 2 of 18 bridge groups held a success.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def apply_sets(settings: dict, sets: list[str]) -> dict:
    """A copy of `settings` with each `key.path=JSON` of `sets` applied (the CLI checks the keys)."""
    out = json.loads(json.dumps(settings))
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected key.path=JSON")
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        try:
            node[leaf] = json.loads(value)
        except json.JSONDecodeError as err:
            raise SystemExit(f"--set {item!r}: the value is not JSON ({err})") from None
    return out


def recipe_with(method: str, sets: list[str]) -> dict:
    return apply_sets(yaml.safe_load((REPO / "config/config.yaml").read_text())["recipes"][method], sets)


def run(cmd: list[str], log: Path, cwd: Path) -> None:
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} failed (rc {proc.returncode}); see {log}")


def distinct_per_search(predictions) -> float | None:
    """Distinct queries per search, averaged over the questions that searched (RAG-R1's parallel
    queries: one search of "A? | B?" counts 2, a repeated query once)."""
    pairs = [(len(set(q)), s) for q, s in zip(predictions["queries"].to_list(), predictions["searches"].to_list()) if s]
    return sum(d / s for d, s in pairs) / len(pairs) if pairs else None


def paired_summary(sft: Path, rl: Path, metric: str = "em") -> dict:
    """`rl` against `sft` over the same questions, overall and per question type."""
    import polars as pl

    return paired_frames(pl.read_parquet(sft), pl.read_parquet(rl), metric, f"{sft} and {rl}")


def paired_frames(a, b, metric: str, what: str) -> dict:
    """Per-question rows `b` against `a` (id, question_type, the metric, searches, and queries
    where there are some), overall and per question type."""
    import polars as pl

    from ragrl.results.paired import paired_bootstrap

    a, b = a.sort("id"), b.sort("id")
    if a["id"].to_list() != b["id"].to_list():
        raise SystemExit(f"{what} hold different questions: not a paired comparison")
    out = {}
    for label in ["all", *sorted(set(a["question_type"].to_list()) - {None, ""})]:  # KGQA rows have no type
        mask = pl.lit(True) if label == "all" else pl.col("question_type") == label
        x, y = a.filter(mask), b.filter(mask)
        diff, low, high = paired_bootstrap(y[metric].to_list(), x[metric].to_list())
        distinct = "queries" in x.columns
        out[label] = {"n": len(x), "metric": metric, "sft_mean": x[metric].mean(), "rl_mean": y[metric].mean(),
                      "diff": {"diff": diff, "low": low, "high": high},
                      "sft_searches": x["searches"].mean(), "rl_searches": y["searches"].mean(),
                      "sft_distinct_per_search": distinct_per_search(x) if distinct else None,
                      "rl_distinct_per_search": distinct_per_search(y) if distinct else None}
    return out


def train_summary(train_log: Path) -> dict:
    steps = [json.loads(line) for line in train_log.read_text().splitlines() if line.strip()]
    rewards = [s["reward_mean"] for s in steps]
    q = max(1, len(rewards) // 4)
    return {"steps": len(steps), "reward_first_quarter": sum(rewards[:q]) / q,
            "reward_last_quarter": sum(rewards[-q:]) / q,
            "final_kl": steps[-1].get("kl"), "step_time_s": sum(s["step_time_s"] for s in steps) / len(steps)}


def evaluate(recipe: dict, method: str, run_id: str, model: Path, index: list[str], results: Path, out: Path,
             log: Path, work_tree: Path, qa: tuple[str, Path] | None = None, questions: int = 100) -> Path:
    """Greedy evaluation on world_test (or `qa`: a dataset name and its QA file) as the DAG's eval
    rule runs it; returns the predictions file."""
    dropped = ("rl", "reward", "sft", "train_dataset", "eval_datasets")
    eval_recipe = {k: v for k, v in recipe.items() if k not in dropped}
    dataset, qa_file = qa or ("world_test", results / "world/qa/test.parquet")
    run([sys.executable, "-m", "ragrl", "eval", "--recipe", json.dumps(eval_recipe), "--recipe-name", method, *index,
         "--dataset", dataset, "--qa", str(qa_file), "--model", str(model), "--run-id", run_id,
         "--max-questions", str(questions), "--batch-size", "100", "--out", str(out)], log, work_tree)
    return out / dataset / "predictions.parquet"


def start_files(out: Path) -> tuple[Path, Path]:
    """Where a new cold start keeps its merged model and its test predictions (`new_cold_start`
    writes them; `--start` reads an earlier variant's)."""
    return out / "sft_merged", out / "sft_eval/world_test/predictions.parquet"


def new_cold_start(args, recipe: dict, results: Path, out: Path, index: list[str]) -> tuple[Path, Path]:
    """SFT from the run's base policy on the run's SFT data (or --sft-data) with `recipe["sft"]`
    (already patched): the merged model and its test predictions."""
    work_tree = results.parent
    py = sys.executable
    base = results / "models/pretrained"
    sft_recipe = {"seed": recipe.get("seed", 0), "sft": recipe["sft"]}
    data = args.sft_data.resolve() if args.sft_data else results / f"sft_data/{args.method}.parquet"
    run([py, "-m", "ragrl", "sft", "--recipe", json.dumps(sft_recipe), "--recipe-name", args.method,
         "--data", str(data), "--policy", str(base), "--out", str(out / "sft")], out / "sft.log", work_tree)
    merged, _ = start_files(out)
    run([py, "-m", "ragrl", "merge", "--base", str(base), "--adapter", str(out / "sft"),
         "--out", str(merged)], out / "sft_merge.log", work_tree)
    preds = evaluate(recipe, args.method, f"{args.name}_sft", merged, index, results, out / "sft_eval",
                     out / "sft_eval.log", work_tree)
    return merged, preds


def print_rows(summary: dict, prefix: str = "") -> None:
    for label, row in summary.items():
        if isinstance(row, dict) and "diff" in row:
            d = row["diff"]
            sft_q, rl_q = row["sft_distinct_per_search"], row["rl_distinct_per_search"]
            distinct = f" distinct/search {sft_q:.2f} -> {rl_q:.2f}" if None not in (sft_q, rl_q) else ""
            print(f"{prefix}{label:11s} n={row['n']:3d} {row['metric']} {row['sft_mean']:.3f} -> {row['rl_mean']:.3f} "
                  f"diff {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] "
                  f"searches {row['sft_searches']:.2f} -> {row['rl_searches']:.2f}{distinct}")


def ablate(args, recipe: dict, results: Path, out: Path) -> None:
    work_tree = results.parent
    py = sys.executable
    method = args.method
    out.mkdir(parents=True, exist_ok=True)
    index = ["--index", str(results / "index/world/flat"), "--mode", "dense"]
    run_sft_preds = results / f"eval/{method}_sft/world_test/predictions.parquet"
    train_qa = args.train_qa.resolve() if args.train_qa else results / "world/qa/train.parquet"
    if args.sft_set:
        sft, sft_preds = new_cold_start(args, recipe, results, out, index)
    elif args.start:
        sft, sft_preds = start_files(args.start.resolve())
        if not sft.is_dir() or not sft_preds.exists():
            raise SystemExit(f"--start {args.start}: expected an --sft-set variant's {sft.name}/ and sft_eval/")
    else:
        sft, sft_preds = results / f"models/{method}/sft_merged", run_sft_preds
    run([py, "-m", "ragrl", "rl", "--recipe", json.dumps(recipe), "--recipe-name", method, *index,
         "--qa", str(train_qa), "--policy", str(sft), "--limit", "0",
         "--out", str(out / "work"), "--log-out", str(out / "train_log.jsonl")], out / "rl.log", work_tree)
    run([py, "-m", "ragrl", "merge", "--base", str(sft), "--adapter", str(out / "work/final"),
         "--out", str(out / "merged")], out / "merge.log", work_tree)
    rl_preds = evaluate(recipe, method, args.name, out / "merged", index, results, out / "eval", out / "eval.log",
                        work_tree)
    summary = {"name": args.name, "method": method, "sets": args.set, "sft_sets": args.sft_set,
               "train_qa": str(train_qa), "start": str(sft),
               **paired_summary(sft_preds, rl_preds, args.metric), "train": train_summary(out / "train_log.jsonl")}
    sections = []  # (summary key, heading) of the further paired comparisons, printed after the main one
    if args.train_questions:
        # Greedy on the questions RL trains on: the start against the RL model, paired.
        on_train = [evaluate(recipe, method, f"{args.name}_{side}", model, index, results, out / f"train_eval_{side}",
                             out / f"train_eval_{side}.log", work_tree, ("world_train", train_qa), args.train_questions)
                    for side, model in (("start", sft), ("rl", out / "merged"))]
        summary["on_train_questions"] = paired_summary(*on_train, args.metric)
        sections.append(("on_train_questions", f"on the first {args.train_questions} questions RL trains on (greedy), "
                                               "the start against the RL model:"))
    if args.sft_set or args.start:
        # The new cold start against the run's own (its "rl" side is the new SFT), and the RL
        # from the new start against the run's SFT: whether the change helps end to end.
        summary["new_sft_vs_run_sft"] = paired_summary(run_sft_preds, sft_preds, args.metric)
        summary["rl_vs_run_sft"] = paired_summary(run_sft_preds, rl_preds, args.metric)
        sections += [("new_sft_vs_run_sft", "the new SFT against the run's SFT:"),
                     ("rl_vs_run_sft", "the RL from the new SFT against the run's SFT:")]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print_rows(summary)
    for key, heading in sections:
        print(heading)
        print_rows(summary[key], "  ")
    t = summary["train"]
    print(f"train reward {t['reward_first_quarter']:.3f} -> {t['reward_last_quarter']:.3f} over {t['steps']} steps, "
          f"final kl {t['final_kl']}, {t['step_time_s']:.1f} s/step")


def diagnose(args, recipe: dict, results: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragrl.eval.evaluate import question_type
    from ragrl.io import read_columns
    from ragrl.recipe import parse_recipe
    from ragrl.stages.agent import environment, load_backends
    from ragrl.stages.agent_rl import make_rollout_fn

    parsed = parse_recipe(json.dumps(recipe), args.method)
    model_dir = results / f"models/{args.method}/sft_merged"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    env = environment(parsed, load_backends(index=results / "index/world/flat", mode="dense"))
    rows = read_columns(results / "world/qa/train.parquet", ["id", "question", "golden_answers"],
                        optional=("metadata", "supporting_ids")).to_pylist()[: args.questions]
    rollout = make_rollout_fn(parsed, tok, env)
    per_type: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for start in range(0, len(rows), 8):
        batch = rows[start : start + 8]
        with torch.no_grad():
            samples = rollout(batch, args.group, model, 1)
        groups = collections.defaultdict(list)
        for s in samples:
            kind = question_type(batch[s.group])
            em, n = s.stats.get("reward_em", 0.0), s.stats["searches"]
            c = per_type[kind]
            c["n"] += 1
            c["em"] += em
            c[f"searches={n}"] += 1
            c[f"em|searches={n}"] += em
            groups[s.group].append((s.reward, em))
        for g, members in groups.items():
            c = per_type[question_type(batch[g])]
            c["groups"] += 1
            c["groups_with_success"] += any(em > 0 for _, em in members)
            c["tied_groups"] += len({r for r, _ in members}) == 1
        print(f"[diagnose] {min(start + 8, len(rows))}/{len(rows)} questions", file=sys.stderr, flush=True)
    for kind, c in sorted(per_type.items()):
        row = {"type": kind, "rollouts": c["n"], "em": round(c["em"] / c["n"], 3)}
        for k in range(6):
            if c[f"searches={k}"]:
                row[f"searches={k}"] = (f"{c[f'searches={k}'] / c['n']:.2f} "
                                        f"(em {c[f'em|searches={k}'] / c[f'searches={k}']:.2f})")
        row.update(groups=c["groups"], groups_with_success=c["groups_with_success"], tied_groups=c["tied_groups"])
        print(json.dumps(row))


def logged_command(log: Path) -> list[str]:
    """The `ragrl` arguments a job's log starts with (`$ ragrl <cmd> ...`, ragrl.cli.main)."""
    line = log.read_text().splitlines()[0] if log.exists() else ""
    if not line.startswith("$ ragrl "):
        raise SystemExit(f"{log}: expected the job's command as its first line ('$ ragrl ...')")
    return shlex.split(line[2:])[1:]


def with_option(argv: list[str], key: str, value: str) -> list[str]:
    out = list(argv)
    if key not in out:
        raise SystemExit(f"{key} not in the logged command {' '.join(argv[:2])} ...")
    out[out.index(key) + 1] = value
    return out


def paired_datasets(sft_eval: Path, rl_eval: Path, metric: str) -> dict:
    return {ds.name: paired_summary(sft_eval / ds.name / "predictions.parquet", ds / "predictions.parquet", metric)
            for ds in sorted(rl_eval.iterdir()) if (ds / "predictions.parquet").exists()}


def from_logs(args, results: Path, out: Path) -> None:
    work_tree, logs, py = results.parent, results.parent / "logs", sys.executable
    out.mkdir(parents=True, exist_ok=True)
    rl = logged_command(logs / f"rl/{args.method}.log")
    recipe = apply_sets(json.loads(rl[rl.index("--recipe") + 1]), args.set)
    rl = with_option(with_option(with_option(rl, "--recipe", json.dumps(recipe)), "--out", str(out / "work")),
                     "--log-out", str(out / "train_log.jsonl"))
    run([py, "-m", "ragrl", *rl], out / "rl.log", work_tree)
    merge = with_option(with_option(logged_command(logs / f"merge/{args.method}_rl.log"), "--adapter",
                                    str(out / "work/final")), "--out", str(out / "merged"))
    run([py, "-m", "ragrl", *merge], out / "merge.log", work_tree)
    ev = logged_command(logs / f"eval/{args.method}_rl.log")
    ev = with_option(with_option(with_option(ev, "--model", str(out / "merged")), "--out", str(out / "eval")),
                     "--run-id", args.name)
    run([py, "-m", "ragrl", *ev], out / "eval.log", work_tree)
    summary = {"name": args.name, "method": args.method, "sets": args.set,
               "datasets": paired_datasets(results / f"eval/{args.method}_sft", out / "eval", args.metric),
               "train": train_summary(out / "train_log.jsonl")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    for dataset, rows in summary["datasets"].items():
        print(dataset)
        print_rows(rows, "  ")
    t = summary["train"]
    print(f"train reward {t['reward_first_quarter']:.3f} -> {t['reward_last_quarter']:.3f} over {t['steps']} steps, "
          f"final kl {t['final_kl']}, {t['step_time_s']:.1f} s/step")


def sampled(args, results: Path, out: Path) -> None:
    import polars as pl

    work_tree, logs = results.parent, results.parent / "logs"
    models = {"sft": None, "rl": None}
    for item in args.extra:
        name, sep, path = item.partition("=")
        if not sep or name in models:
            raise SystemExit(f"--extra {item!r}: expected a new NAME=DIR")
        models[name] = str(Path(path).resolve())
    out.mkdir(parents=True, exist_ok=True)
    per_question: dict[tuple[str, str], pl.DataFrame] = {}
    for name, model in models.items():
        ev = logged_command(logs / f"eval/{args.method}_{'rl' if model else name}.log")
        if model:
            ev = with_option(with_option(ev, "--model", model), "--run-id", name)
        frames: dict[str, list] = collections.defaultdict(list)
        for k in range(args.sampled):
            dest = out / f"{name}/seed{k}"
            if not dest.exists():  # a re-run with more --extra models reuses the passes made
                run([sys.executable, "-m", "ragrl", *with_option(ev, "--out", str(dest)), "--temperature", "recipe",
                     "--seed", str(k)], out / f"{name}_seed{k}.log", work_tree)
            for ds in sorted(d for d in dest.iterdir() if d.is_dir()):
                frames[ds.name].append(pl.read_parquet(ds / "predictions.parquet",
                                                       columns=["id", "question_type", args.metric, "searches"]))
        for ds, dfs in frames.items():
            per_question[(name, ds)] = (pl.concat(dfs).group_by("id")
                                        .agg(pl.col("question_type").first(), pl.col(args.metric).mean(),
                                             (pl.col(args.metric) >= args.right_from).mean().alias("right_share"),
                                             pl.col("searches").mean()).sort("id"))
    summary: dict = {"method": args.method, "samples": args.sampled, "metric": args.metric, "models": models,
                     "datasets": {}}
    for (name, ds), y in sorted(per_question.items()):
        x = per_question.get(("sft", ds))
        if name == "sft" or x is None:
            continue
        rows = paired_frames(x, y, args.metric, f"{name} and sft on {ds}")
        print(f"{ds}: {name} against sft, {args.metric} the mean of {args.sampled} samples per question")
        print_rows(rows, "  ")
        summary["datasets"].setdefault(ds, {})[name] = rows
    for ds in sorted(ds for name, ds in per_question if name == "sft"):
        greedy = {model: greedy_predictions(results, args.method, model, path, ds) for model, path in models.items()}
        if greedy["sft"] is None:
            continue
        after = {model: frame for model, frame in greedy.items() if model != "sft" and frame is not None}
        rows = headroom(per_question[("sft", ds)], greedy["sft"], after, args.metric, args.right_from, ds)
        print(f"{ds}: where RL's samples reach, by the start's greedy answer ({args.sampled} samples per question)")
        print_headroom(rows, args.sampled, "  ")
        summary.setdefault("headroom", {})[ds] = rows
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def greedy_predictions(results: Path, method: str, model: str, path: str | None, dataset: str):
    """A model's greedy test predictions: the run's own evaluation (sft, rl), or a variant's
    (DIR/../eval of an --extra DIR); None where there are none."""
    import polars as pl

    folder = results / f"eval/{method}_{model}" if path is None else Path(path).parent / "eval"
    file = folder / dataset / "predictions.parquet"
    return pl.read_parquet(file) if file.exists() else None


def headroom(sampled, greedy, after: dict, metric: str, right: float, dataset: str) -> dict:
    """Per question type, what on-policy RL can reinforce from the start (an answer is right
    where `metric` >= `right`; `sampled` holds each question's share of right samples): of the
    questions the start answers wrong greedily, how many any of its K samples answers right and
    their mean share of right samples; of those it answers right, how many its samples answer right
    less than a quarter of the time; and each later model's greedy gains and losses against the
    start, with the start's share of right samples on those questions. Not a ceiling: RL trains on
    other questions, and a question no sample reached can still turn."""
    import polars as pl

    questions = set(sampled["id"].to_list())
    table = sampled
    for name, frame in {"greedy": greedy, **{f"after:{model}": f for model, f in after.items()}}.items():
        if set(frame["id"].to_list()) != questions:
            raise SystemExit(f"{dataset}: {name}'s greedy predictions and the sampled passes hold different "
                             "questions: not a paired comparison")
        table = table.join(frame.select("id", pl.col(metric).alias(name)), on="id")
    out = {}
    for label in ["all", *sorted(set(table["question_type"].to_list()) - {None, ""})]:
        x = table if label == "all" else table.filter(pl.col("question_type") == label)
        wrong, ok = x.filter(pl.col("greedy") < right), x.filter(pl.col("greedy") >= right)
        row = {"n": len(x), "greedy_wrong": len(wrong),
               "wrong_reached": int((wrong["right_share"] > 0).sum()),
               "wrong_right_share": wrong["right_share"].mean() if len(wrong) else None,
               "greedy_right": len(ok), "right_right_share": ok["right_share"].mean() if len(ok) else None,
               "right_fragile": int((ok["right_share"] < 0.25).sum()), "after": {}}
        for name in after:
            gained = x.filter((pl.col("greedy") < right) & (pl.col(f"after:{name}") >= right))
            lost = x.filter((pl.col("greedy") >= right) & (pl.col(f"after:{name}") < right))
            row["after"][name] = {"gained": len(gained), "lost": len(lost),
                                  "start_right_share_on_gained": gained["right_share"].round(3).to_list(),
                                  "start_right_share_on_lost": lost["right_share"].round(3).to_list()}
        out[label] = row
    return out


def print_headroom(rows: dict, k: int, prefix: str = "") -> None:
    def f(value):
        return "-" if value is None else f"{value:.3f}"

    for label, row in rows.items():
        print(f"{prefix}{label:11s} n={row['n']:3d} greedy wrong {row['greedy_wrong']:3d}: right in any of {k} samples "
              f"{row['wrong_reached']:3d}, share of samples right {f(row['wrong_right_share'])} | greedy right "
              f"{row['greedy_right']:3d}: share of samples right {f(row['right_right_share'])}, "
              f"below 0.25 {row['right_fragile']:3d}")
        for name, a in row["after"].items():
            print(f"{prefix}  {name}: gains {a['gained']} (start's share right {a['start_right_share_on_gained']}), "
                  f"losses {a['lost']} (start's share right {a['start_right_share_on_lost']})")


def decision(args, results: Path) -> None:
    import polars as pl
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragrl.eval.evaluate import question_type
    from ragrl.toy.gold import ANSWER_LEAD, NEXT_HOP

    model_dir = args.model or results / f"models/{args.method}/sft_merged"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    train = pl.read_parquet(results / "world/qa/train.parquet", columns=["id", "metadata"])
    kinds = {r["id"]: question_type(r) for r in train.iter_rows(named=True)}
    # In the trajectories each phrase follows a space: " Next" and " So" are the tokens decided on.
    go_on_text, stop_text = f" {NEXT_HOP}", f" {ANSWER_LEAD}"
    go_on, stop = (tok(phrase, add_special_tokens=False).input_ids[0] for phrase in (go_on_text, stop_text))
    per_type: dict[str, list[tuple[float, bool]]] = collections.defaultdict(list)
    rows = pl.read_parquet(results / f"sft_data/{args.method}.parquet", columns=["id", "text"]).to_dicts()
    for row in rows[: args.questions]:
        text = row["text"]
        first_obs = text.find("</information>")
        cuts = [(text.find(phrase, first_obs), phrase == go_on_text) for phrase in (go_on_text, stop_text)]
        cuts = [(at, gold) for at, gold in cuts if at >= 0]
        if first_obs < 0 or not cuts:
            continue  # no search, or no decision after it
        at, gold_go_on = min(cuts)
        with torch.no_grad():
            logits = model(torch.tensor([tok(text[:at]).input_ids])).logits[0, -1]
        p = torch.softmax(logits.float(), -1)
        per_type[kinds[row["id"]]].append((float(p[go_on] / (p[go_on] + p[stop])), gold_go_on))
    for kind, values in sorted(per_type.items()):
        probs = [v for v, _ in values]
        print(json.dumps({"type": kind, "rows": len(values),
                          "gold_goes_on": round(sum(g for _, g in values) / len(values), 3),
                          "mean_p_go_on": round(sum(probs) / len(probs), 3),
                          "greedy_goes_on": round(sum(v > 0.5 for v in probs) / len(probs), 3)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="a finished run's results/ directory")
    p.add_argument("--method", default="search_r1",
                   help="the default config's recipe: search_r1, rag_r1, autograph_r1 (with --metric); "
                        "any agent method with --from-logs (kg_r1)")
    p.add_argument("--name", default="variant")
    p.add_argument("--set", action="append", default=[], help="key.path=JSON on top of the default recipe")
    p.add_argument("--sft-set", action="append", default=[],
                   help="key.path=JSON on top of the recipe: train a new SFT start with it first (sft.epochs=6)")
    p.add_argument("--train-qa", type=Path, help="RL's training questions (a QA parquet) instead of RUN's world_train")
    p.add_argument("--sft-data", type=Path, help="--sft-set: the new start's SFT data instead of RUN's")
    p.add_argument("--start", type=Path, help="RL from an earlier --sft-set variant's start (its OUT/<name> directory)")
    p.add_argument("--train-questions", type=int, metavar="N",
                   help="also evaluate the start and the RL model greedily on the first N training questions")
    p.add_argument("--out", type=Path, default=Path("rl_ablation"))
    p.add_argument("--metric", default="em", help="the per-question column compared paired (autograph_r1: recall@5)")
    p.add_argument("--right-from", type=float, default=1.0,
                   help="--sampled: an answer counts as right where --metric is at least this (1.0: exact match; "
                        "e.g. 0.5 for f1)")
    p.add_argument("--diagnose", action="store_true", help="sampled rollouts of the SFT model by question type")
    p.add_argument("--decision", action="store_true",
                   help="teacher-forced P(another search) after the first observation, by question type")
    p.add_argument("--model", type=Path, help="--decision: this model instead of the run's SFT model")
    p.add_argument("--from-logs", action="store_true",
                   help="RL, merge and evaluation from the run's logged commands (any agent method, e.g. kg_r1)")
    p.add_argument("--sampled", type=int, metavar="K",
                   help="evaluate SFT, RL and each --extra K times at the rollout temperature, paired on the means")
    p.add_argument("--extra", action="append", default=[], metavar="NAME=DIR", help="--sampled: another model")
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--group", type=int, default=8)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    not_sft = [item for item in args.sft_set if not item.startswith("sft.")]
    if not_sft:
        raise SystemExit(f"--sft-set {not_sft[0]!r}: only sft.* keys train a new start; give the others with --set")
    if args.start and args.sft_set:
        raise SystemExit("--start and --sft-set both name the start: give one")
    if args.sft_data and not args.sft_set:
        raise SystemExit("--sft-data is the data of a new start: give --sft-set too")
    variant_inputs = [flag for flag, value in (("--train-qa", args.train_qa), ("--sft-data", args.sft_data),
                                               ("--start", args.start), ("--train-questions", args.train_questions))
                      if value]
    other_mode = [flag for flag, on in (("--from-logs", args.from_logs), ("--sampled", args.sampled),
                                        ("--diagnose", args.diagnose), ("--decision", args.decision)) if on]
    if variant_inputs and other_mode:
        raise SystemExit(f"{variant_inputs[0]} shapes the default mode's variant; {other_mode[0]} does not read it")
    results = args.results.resolve()
    if args.sampled:
        return sampled(args, results, (args.out / f"{args.name}_sampled").resolve())
    if args.from_logs:
        return from_logs(args, results, (args.out / args.name).resolve())
    recipe = recipe_with(args.method, args.set + args.sft_set)
    if args.decision:
        decision(args, results)
    elif args.diagnose:
        diagnose(args, recipe, results)
    else:
        ablate(args, recipe, results, (args.out / args.name).resolve())


if __name__ == "__main__":
    main()
