"""Paired comparisons (ragrl.results.paired), their DuckDB table and delta tables, the family /
forest / reward-curve figures, and the lineage the workflow derives from the recipes."""

from __future__ import annotations

import json
import os
import shlex
import struct
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ragrl.results import (build_database, plot_families, plot_metrics, plot_paired, plot_reward_curves,
                           plot_training, render_delta_tables)
from ragrl.results.paired import Lineage, derive_pairs, family_order, paired_bootstrap, parse_lineage
from ragrl.results.plots import (MAX_ROWS, family_figure, metrics_figure, paired_figure, reward_curves_figure,
                                 smoothing_window, trailing_mean)

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


# --------------------------------------------------------------------------------------------
# the bootstrap, by hand
# --------------------------------------------------------------------------------------------

def test_paired_bootstrap_hand_computed_case():
    # Differences 1, 0, 0, 0: mean 0.25. A resample's mean is k/4 with k ~ Binomial(4, 1/4):
    # P(k = 0) = 0.316 > 2.5%, so the low end is 0; P(k <= 2) = 0.949 < 97.5% <= P(k <= 3) = 0.996,
    # so the high end is 0.75, whatever the seed (2,000 resamples leave no doubt either way).
    for seed in (0, 1, 7):
        assert paired_bootstrap([1, 1, 0, 1], [0, 1, 0, 1], seed=seed) == (0.25, 0.0, 0.75)


def test_paired_bootstrap_mean_is_exact_and_interval_deterministic():
    run, base = [0.5, 1.0, 0.25, 1.0], [0.0, 1.0, 0.75, 0.0]  # differences .5, 0, -.5, 1: mean .25
    diff, low, high = paired_bootstrap(run, base)
    assert diff == 0.25
    assert low <= diff <= high and -0.5 <= low < high <= 1.0
    assert paired_bootstrap(run, base) == (diff, low, high)  # fixed seed
    # Four questions allow few distinct resample means, so two seeds agree there; on 30 continuous
    # values the seed is what fixes the interval.
    run, base = [(i * 0.37) % 1 for i in range(30)], [(i * 0.61) % 1 for i in range(30)]
    assert paired_bootstrap(run, base) == paired_bootstrap(run, base)
    assert paired_bootstrap(run, base, seed=1) != paired_bootstrap(run, base)


def test_paired_bootstrap_of_identical_runs_is_zero():
    assert paired_bootstrap([1, 0, 0.5, 1], [1, 0, 0.5, 1]) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_pairs_by_position_not_by_mean():
    # Same means (0.5), opposite answers on every question: the unpaired means agree, the paired
    # interval must still be wide, centred on 0.
    diff, low, high = paired_bootstrap([1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1])
    assert diff == 0.0 and low < -0.3 and high > 0.3


def test_paired_bootstrap_rejects_unpaired_input():
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError, match="no paired questions"):
        paired_bootstrap([], [])


# --------------------------------------------------------------------------------------------
# which pairs
# --------------------------------------------------------------------------------------------

LINEAGE = {
    "base": {"family": "search", "step": "base"},
    "no_retrieval": {"family": "search", "step": "no_retrieval", "variant_of": "base"},
    "search_sft": {"family": "search", "step": "sft", "start_run": "base"},
    "search_rl": {"family": "search", "step": "rl", "start_run": "search_sft"},
    "search_oracle": {"family": "search", "step": "oracle", "variant_of": "search_rl"},
    "multi_sft": {"family": "multi", "step": "sft", "start_run": "base"},
    "multi_rl": {"family": "multi", "step": "rl", "start_run": "multi_sft"},
    "fact_base": {"family": "fact", "step": "base"},
    "fact_sft": {"family": "fact", "step": "sft", "start_run": "fact_base"},
    "fact_rl": {"family": "fact", "step": "rl", "start_run": "fact_sft"},
    "fact_ablation_rl": {"family": "fact", "step": "rl", "start_run": "fact_sft", "ablation_of": "fact_rl"},
}


def pair_set(pairs):
    return {(p.run, p.baseline, p.relation) for p in pairs}


def test_pairs_follow_the_lineage_links():
    pairs = derive_pairs(parse_lineage(LINEAGE))
    assert pair_set(pairs) == {
        ("no_retrieval", "base", "no_retrieval vs base"),
        ("search_sft", "base", "sft vs base"),
        ("search_rl", "search_sft", "rl vs sft"),
        ("search_oracle", "search_rl", "oracle vs rl"),
        ("multi_sft", "base", "sft vs base"),
        ("multi_rl", "multi_sft", "rl vs sft"),
        ("fact_sft", "fact_base", "sft vs base"),
        ("fact_rl", "fact_sft", "rl vs sft"),
        ("fact_ablation_rl", "fact_rl", "ablation vs full"),
        ("fact_ablation_rl", "fact_sft", "rl vs sft"),
    }


def test_a_run_starting_from_a_variant_is_also_paired_with_what_the_variant_varies():
    lineage = parse_lineage({
        "frozen": {"family": "r", "step": "base"},
        "frozen_state": {"family": "r", "step": "state", "variant_of": "frozen"},
        "trained": {"family": "r", "step": "rl", "start_run": "frozen_state"},
        "trained_plain": {"family": "r", "step": "rl", "start_run": "frozen", "ablation_of": "trained"},
    })
    assert pair_set(derive_pairs(lineage)) == {
        ("frozen_state", "frozen", "state vs base"),
        ("trained", "frozen_state", "rl vs state"),
        ("trained", "frozen", "rl vs base"),
        ("trained_plain", "frozen", "rl vs base"),
        ("trained_plain", "trained", "ablation vs full"),
    }


def test_method_pairs_are_final_runs_of_two_families_in_one_table():
    lineage = parse_lineage(LINEAGE)
    tables = [["base", "search_sft", "search_rl", "search_oracle", "multi_sft", "multi_rl"],
              ["fact_base", "fact_rl", "search_rl"],  # not a table a reader compares these in... but it is one
              ["fact_rl", "fact_ablation_rl"]]  # an ablation is no method of its own
    extra = pair_set(derive_pairs(lineage, tables)) - pair_set(derive_pairs(lineage))
    # The earlier-listed run is the baseline; SFT runs and oracles are not final runs.
    assert extra == {("multi_rl", "search_rl", "method vs method"), ("search_rl", "fact_rl", "method vs method")}
    # A table of all runs (runs: null) pairs every two final runs of different families.
    assert pair_set(derive_pairs(lineage, [None])) - pair_set(derive_pairs(lineage)) == {
        ("multi_rl", "search_rl", "method vs method"), ("fact_rl", "search_rl", "method vs method"),
        ("fact_rl", "multi_rl", "method vs method")}


def test_lineage_is_checked():
    with pytest.raises(ValueError, match="'start_run' names 'nowhere'"):
        parse_lineage({"a": {"family": "f", "step": "rl", "start_run": "nowhere"}})
    with pytest.raises(ValueError, match="names the run itself"):
        parse_lineage({"a": {"family": "f", "step": "rl", "variant_of": "a"}})
    with pytest.raises(ValueError, match="unknown field"):
        parse_lineage({"a": {"family": "f", "step": "rl", "parent": "b"}})
    with pytest.raises(ValueError, match="no such run among the run manifests"):
        parse_lineage({"a": {"family": "f", "step": "rl"}}, runs={"b": ("r", "rl")})
    # Runs it does not name: their own recipe's family, at their stage; in the runs' order.
    out = parse_lineage({"b": {"family": "f", "step": "rl", "start_run": "a"}}, runs={"a": ("r", "sft"), "b": ("r", "rl")})
    assert out == {"a": Lineage("r", "sft"), "b": Lineage("f", "rl", start_run="a")}
    assert list(out) == ["a", "b"]


def test_family_order_is_the_pipeline():
    lineage = parse_lineage(LINEAGE)
    shuffled = ["search_oracle", "search_rl", "no_retrieval", "search_sft", "base"]
    assert family_order(shuffled, lineage) == ["base", "no_retrieval", "search_sft", "search_rl", "search_oracle"]
    assert family_order(["fact_ablation_rl", "fact_rl", "fact_sft", "fact_base"], lineage) == [
        "fact_base", "fact_sft", "fact_rl", "fact_ablation_rl"]


# --------------------------------------------------------------------------------------------
# the lineage the workflow derives from the recipes (a dry run)
# --------------------------------------------------------------------------------------------

def _dry_run_build_args(workdir: Path, config: dict) -> list[str]:
    """The `ragrl results build` command line a dry run of `config` plans; checks on the way that
    rule results_plots declares the figures `ragrl results plots` writes for that database: one
    family figure per family of the lineage, one training figure per training log."""
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    (workdir / "resources").symlink_to(REPO / "resources")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([SNAKEMAKE, "-n", "-p", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(cfg), "--cores", "1", "results/plots/reward_curves.png"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if "ragrl results build" in ln]
    args = shlex.split(line)
    lines = proc.stdout.splitlines()
    block = lines[lines.index("rule results_plots:"):]
    declared = {Path(p).name for p in next(ln for ln in block if ln.strip().startswith("output:"))
                .split("output:", 1)[1].split(",") if p.strip()}
    families = {e["family"] for e in json.loads(args[args.index("--lineage") + 1]).values()}
    logs = args[args.index("--train-logs") + 1:args.index("--benchmarks-dir")]
    assert {n for n in declared if n.startswith("family_")} == {f"family_{f}.png" for f in families}
    assert {n for n in declared if n.endswith("_training.png")} == {f"{Path(p).parent.name}_training.png"
                                                                    for p in logs}
    return args


@pytest.mark.slow
def test_workflow_lineage_pairs_rl_with_its_sft_start(tmp_path):
    """A config of three recipes: search_r1 (SFT then RL), its twin without SFT (RL starts from the
    base policy) and kg_r1 (its own datasets); exactly these pairs come out of the DAG's lineage."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    recipes = cfg["recipes"]
    cfg["recipes"] = {"search_r1": recipes["search_r1"], "kg_r1": recipes["kg_r1"],
                      "no_sft": {**recipes["search_r1"], "sft": {**recipes["search_r1"]["sft"], "enabled": False}}}
    cfg["recipes"]["kg_r1"]["eval_datasets"] = ["world_kgqa_A_test", "world_kgqa_B_test"]
    cfg["construct_kg"] = None
    cfg["datasets"].pop("world_kgqa_A_test_built")
    cfg["kgs"].pop("world_built")
    cfg["harr"] = None
    runs = ["base", "no_retrieval", "search_r1_sft", "search_r1_rl", "search_r1_oracle", "no_sft_rl", "no_sft_oracle"]
    cfg["results"]["tables"] = [{"name": "main", "metric": "em", "datasets": ["world_test"], "runs": runs},
                                {"name": "kg", "metric": "f1", "runs": ["kg_r1_sft", "kg_r1_rl"]}]
    args = _dry_run_build_args(tmp_path, cfg)
    lineage = parse_lineage(json.loads(args[args.index("--lineage") + 1]))
    tables = json.loads(args[args.index("--tables") + 1])
    assert lineage["search_r1_rl"] == Lineage("search_r1", "rl", start_run="search_r1_sft")
    assert lineage["no_sft_rl"] == Lineage("no_sft", "rl", start_run="base")
    assert pair_set(derive_pairs(lineage, [t["runs"] for t in tables])) == {
        ("no_retrieval", "base", "no_retrieval vs base"),
        ("search_r1_sft", "base", "sft vs base"),
        ("search_r1_rl", "search_r1_sft", "rl vs sft"),
        ("search_r1_oracle", "search_r1_rl", "oracle vs rl"),
        ("no_sft_rl", "base", "rl vs base"),
        ("no_sft_oracle", "no_sft_rl", "oracle vs rl"),
        ("no_sft_rl", "search_r1_rl", "method vs method"),
        ("kg_r1_rl", "kg_r1_sft", "rl vs sft"),
        # A link, but kg_r1 answers its KG datasets and base world_test: no shared question (the
        # database test below shows such a pair gets no row).
        ("kg_r1_sft", "base", "sft vs base"),
    }


@pytest.mark.slow
def test_workflow_lineage_of_an_ablation_sharing_the_sft_start(tmp_path):
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["recipes"] = {k: cfg["recipes"][k] for k in ("search_r1", "knowrl", "knowrl_no_fact")}  # search_r1: HARR's generator
    cfg["construct_kg"] = None
    cfg["results"]["tables"] = [t for t in cfg["results"]["tables"] if t["name"].startswith(("knowrl", "harr"))]
    cfg["datasets"].pop("world_kgqa_A_test_built")
    cfg["kgs"].pop("world_built")
    args = _dry_run_build_args(tmp_path, cfg)
    lineage = parse_lineage(json.loads(args[args.index("--lineage") + 1]))
    pairs = pair_set(derive_pairs(lineage, [t["runs"] for t in json.loads(args[args.index("--tables") + 1])]))
    assert {p for p in pairs if p[0].startswith("knowrl")} == {
        ("knowrl_sft", "knowrl_base", "sft vs base"),
        ("knowrl_rl", "knowrl_sft", "rl vs sft"),
        ("knowrl_no_fact_rl", "knowrl_sft", "rl vs sft"),
        ("knowrl_no_fact_rl", "knowrl_rl", "ablation vs full"),
    }
    # HARR (config harr, HARR_RUNS' flags): trained encoders start from the frozen one under the
    # same states, the frozen encoder on history-aware states varies the plain frozen run, and the
    # query-only encoder is HARR's ablation.
    assert {p for p in pairs if p[0].startswith("harr")} == {
        ("harr_frozen_history", "harr_frozen", "history vs base"),
        ("harr", "harr_frozen_history", "rl vs history"),
        ("harr", "harr_frozen", "rl vs base"),
        ("harr_no_history", "harr_frozen", "rl vs base"),
        ("harr_no_history", "harr", "ablation vs full"),
    }


# --------------------------------------------------------------------------------------------
# the paired table in a database built from workflow outputs
# --------------------------------------------------------------------------------------------

def write_run(root: Path, run_id: str, recipe: str, stage: str, preds: dict[str, dict[str, list]],
              train_log: list[dict] | None = None) -> dict[str, list[Path]]:
    """run.json, and per dataset predictions.parquet (`preds[dataset]`: columns) and metrics.json."""
    run_json = root / "runs" / run_id / "run.json"
    run_json.parent.mkdir(parents=True, exist_ok=True)
    run_json.write_text(json.dumps({"run_id": run_id, "recipe": recipe, "model": "tiny", "stage": stage,
                                    "config_hash": "h", "git_commit": "c", "seeds": {"world": 1}}))
    out = {"runs": [run_json], "evals": [], "predictions": [], "train_logs": []}
    for dataset, cols in preds.items():
        n = len(cols["id"])
        table = pa.table({"question": [f"q {i}" for i in cols["id"]], "golden_answers": [["a"]] * n,
                          "prediction": ["a"] * n, "turns": [1] * n, "queries": [[]] * n, "generated_tokens": [1] * n,
                          "observation_tokens": [0] * n, "latency_s": [0.1] * n, **cols})
        d = root / "eval" / run_id / dataset
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, d / "predictions.parquet")
        summary = _summary(cols, range(n))
        summary["by_type"] = {t: _summary(cols, [i for i in range(n) if cols["question_type"][i] == t])
                              for t in sorted(set(cols.get("question_type", [])))}
        (d / "metrics.json").write_text(json.dumps({"run_id": run_id, "dataset": dataset, **summary}))
        out["predictions"].append(d / "predictions.parquet")
        out["evals"].append(d / "metrics.json")
    if train_log:
        log = root / "train" / run_id / "train_log.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps(r) + "\n" for r in train_log))
        out["train_logs"].append(log)
    return out


def _summary(cols: dict[str, list], rows) -> dict:
    rows = list(rows)
    metrics = {m: sum(vals[i] for i in rows) / len(rows) for m, vals in cols.items() if m not in ("id", "question_type")}
    return {"n": len(rows), "metrics": metrics, "ci95": {m: [v - 0.1, v + 0.1] for m, v in metrics.items()}}


def build(root: Path, runs: dict[str, tuple], lineage: dict, tables: list[dict]) -> Path:
    """A results database of `runs` (run -> (recipe, stage, preds[, train_log])), as the workflow builds it."""
    inputs: dict[str, list[Path]] = {"runs": [], "evals": [], "predictions": [], "train_logs": []}
    for run_id, (recipe, stage, preds, *log) in runs.items():
        for key, paths in write_run(root, run_id, recipe, stage, preds, log[0] if log else None).items():
            inputs[key] += paths
    db = root / "ragrl.duckdb"
    build_database(db, **inputs, benchmarks=[], rule_gpus={}, table_specs=tables, lineage=lineage)
    return db


IDS = ["q0", "q1", "q2", "q3"]
TYPES = ["1hop", "1hop", "bridge", "bridge"]


def nq(em: list, f1: list | None = None, ids: list[str] = IDS, types: list[str] = TYPES) -> dict:
    return {"nq": {"id": ids, "question_type": types, "em": em, "f1": f1 if f1 is not None else em}}


PAIRED_RUNS = {
    "base": ("search", "base", nq([0.0, 0.0, 0.0, 1.0])),
    "search_sft": ("search", "sft", nq([0.0, 1.0, 0.0, 1.0])),
    # q3 missing: paired over the three questions both answered
    "search_rl": ("search", "rl", nq([1.0, 1.0, 1.0], ids=IDS[:3], types=TYPES[:3]),
                  [{"step": s, "reward_mean": 0.1 * s, "reward_std": 0.1, "kl": 0.01 * s,
                    "tied_group_share": 0.5 - 0.05 * s} for s in range(12)]),
    "search_oracle": ("search", "oracle", nq([1.0, 1.0, 1.0, 1.0])),
    # Another task's run on other questions: its lineage links it to base, but nothing is shared.
    "kg_sft": ("kg", "sft", {"kgqa": {"id": IDS, "question_type": TYPES, "em": [1.0] * 4, "f1": [1.0] * 4}}),
}
PAIRED_LINEAGE = {**{r: LINEAGE[r] for r in ("base", "search_sft", "search_rl", "search_oracle")},
                  "kg_sft": {"family": "kg", "step": "sft", "start_run": "base"}}
PAIRED_TABLES = [{"name": "main", "metric": "em", "runs": ["base", "search_sft", "search_rl", "search_oracle"],
                  "datasets": ["nq", "nq:1hop", "nq:bridge"]}]


@pytest.fixture(scope="module")
def paired_db(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("paired"), PAIRED_RUNS, PAIRED_LINEAGE, PAIRED_TABLES)


def q(db: Path, sql: str, params=None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def test_runs_table_records_the_lineage(paired_db):
    assert q(paired_db, "SELECT run_id, family, step, start_run, variant_of, ablation_of FROM runs ORDER BY rowid") == [
        ("base", "search", "base", None, None, None),
        ("search_sft", "search", "sft", "base", None, None),
        ("search_rl", "search", "rl", "search_sft", None, None),
        ("search_oracle", "search", "oracle", None, "search_rl", None),
        ("kg_sft", "kg", "sft", "base", None, None),
    ]


def test_paired_table_rows(paired_db):
    rows = q(paired_db, "SELECT run_id, baseline, relation, family, dataset, n, mean_run, mean_baseline, diff "
                        "FROM paired WHERE metric = 'em' ORDER BY rowid")
    assert rows == [
        ("search_sft", "base", "sft vs base", "search", "nq", 4, 0.5, 0.25, 0.25),
        ("search_sft", "base", "sft vs base", "search", "nq:1hop", 2, 0.5, 0.0, 0.5),
        ("search_sft", "base", "sft vs base", "search", "nq:bridge", 2, 0.5, 0.5, 0.0),
        ("search_rl", "search_sft", "rl vs sft", "search", "nq", 3, 1.0, 1 / 3, 2 / 3),
        ("search_rl", "search_sft", "rl vs sft", "search", "nq:1hop", 2, 1.0, 0.5, 0.5),
        ("search_rl", "search_sft", "rl vs sft", "search", "nq:bridge", 1, 1.0, 0.0, 1.0),
        ("search_oracle", "search_rl", "oracle vs rl", "search", "nq", 3, 1.0, 1.0, 0.0),
        ("search_oracle", "search_rl", "oracle vs rl", "search", "nq:1hop", 2, 1.0, 1.0, 0.0),
        ("search_oracle", "search_rl", "oracle vs rl", "search", "nq:bridge", 1, 1.0, 1.0, 0.0),
    ]
    # Only the metric the table shows (em), not f1; the kg run shares no question with base.
    assert q(paired_db, "SELECT DISTINCT metric FROM paired") == [("em",)]
    assert q(paired_db, "SELECT count(*) FROM paired WHERE run_id = 'kg_sft'") == [(0,)]


def test_paired_intervals_are_the_bootstrap_of_the_joined_questions(paired_db):
    (low, high), = q(paired_db, "SELECT ci_low, ci_high FROM paired WHERE run_id = 'search_sft' AND dataset = 'nq'")
    assert (0.25, low, high) == paired_bootstrap([0, 1, 0, 1], [0, 0, 0, 1])
    assert q(paired_db, "SELECT ci_low, ci_high FROM paired WHERE run_id = 'search_oracle' AND dataset = 'nq'") == [
        (0.0, 0.0)]
    (meta,), = q(paired_db, "SELECT value FROM meta WHERE key = 'paired_bootstrap'")
    assert json.loads(meta) == {"resamples": 2000, "seed": 0, "level": 0.95}


def test_pairs_without_a_table_use_the_main_metric(tmp_path):
    db = build(tmp_path, PAIRED_RUNS, PAIRED_LINEAGE, tables=[])
    assert q(db, "SELECT DISTINCT metric FROM paired") == [("em",)]
    assert q(db, "SELECT count(*) FROM paired WHERE dataset = 'nq'") == [(3,)]


def test_without_lineage_nothing_is_paired(tmp_path):
    inputs = {k: [] for k in ("runs", "evals", "predictions", "train_logs")}
    for run_id, (recipe, stage, preds, *_) in PAIRED_RUNS.items():
        for key, paths in write_run(tmp_path, run_id, recipe, stage, preds).items():
            inputs[key] += paths
    db = tmp_path / "r.duckdb"
    build_database(db, **inputs, benchmarks=[], rule_gpus={}, table_specs=PAIRED_TABLES)
    assert q(db, "SELECT count(*) FROM paired") == [(0,)]
    assert q(db, "SELECT family, step FROM runs WHERE run_id = 'search_rl'") == [("search", "rl")]


def test_repeated_question_ids_cannot_be_paired(tmp_path):
    runs = {**PAIRED_RUNS, "base": ("search", "base", nq([0.0, 0.0, 0.0, 1.0], ids=["q0", "q0", "q2", "q3"]))}
    with pytest.raises(ValueError, match="question id 'q0' appears more than once"):
        build(tmp_path, runs, PAIRED_LINEAGE, PAIRED_TABLES)


def test_lineage_naming_an_unknown_run_fails_the_build(tmp_path):
    with pytest.raises(ValueError, match="'start_run' names 'nowhere'"):
        build(tmp_path, PAIRED_RUNS, {**PAIRED_LINEAGE, "kg_sft": {"family": "kg", "step": "sft",
                                                                   "start_run": "nowhere"}}, PAIRED_TABLES)


def test_delta_tables_next_to_the_tables(paired_db, tmp_path):
    paths = render_delta_tables(paired_db, PAIRED_TABLES, tmp_path)
    assert [p.name for p in paths] == ["main_delta.md", "main_delta.csv"]
    md = paths[0].read_text()
    # rl - sft on nq: differences 1, 0, 1 (q3 unanswered by rl): a resample of three 0s has
    # probability 1/27 > 2.5%, so the interval reaches 0; on bridge one question: exactly +1, bold.
    lines = [ln for ln in md.splitlines() if ln.startswith("| search_rl")]
    assert lines == ["| search_rl | search_sft | rl vs sft | +0.667 [+0.000, +1.000] (n=3) | "
                     "+0.500 [+0.000, +1.000] (n=2) | **+1.000 [+1.000, +1.000] (n=1)** |"]
    assert "2,000 resamples" in md
    csv_lines = paths[1].read_text().splitlines()
    assert csv_lines[0] == "run_id,baseline,relation,dataset,n,mean_run,mean_baseline,diff,ci_low,ci_high"
    assert len(csv_lines) == 1 + 9
    # A table of two runs that are no pair says so.
    none = render_delta_tables(paired_db, [{"name": "x", "runs": ["base", "search_oracle"]}], tmp_path)
    assert "No two runs of this table are a compared pair." in none[0].read_text()


def test_a_delta_table_of_a_metric_known_only_as_a_mean_says_so(tmp_path):
    # graph-rank's recall is in metrics.json only: the runs are a pair, but nothing per question
    # can be compared. The file must not claim they are no pair.
    inputs: dict[str, list[Path]] = {"runs": [], "evals": [], "predictions": [], "train_logs": []}
    for run_id, (recipe, stage, preds, *_) in PAIRED_RUNS.items():
        for key, paths in write_run(tmp_path, run_id, recipe, stage, preds).items():
            inputs[key] += paths
    for path in inputs["evals"]:
        m = json.loads(path.read_text())
        m["metrics"]["recall@5"], m["ci95"]["recall@5"] = 0.5, [0.4, 0.6]
        path.write_text(json.dumps(m))
    db = tmp_path / "r.duckdb"
    build_database(db, **inputs, benchmarks=[], rule_gpus={}, table_specs=PAIRED_TABLES, lineage=PAIRED_LINEAGE)
    (md, _) = render_delta_tables(db, [{"name": "r", "metric": "recall@5", "runs": ["search_sft", "search_rl"]}],
                                  tmp_path / "t")
    assert "no run of this table has recall@5 per question" in md.read_text()
    assert "compared pair" not in md.read_text()


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------

def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def panel_series(fig) -> list[int]:
    """Per drawn panel: how many runs or pairs it lists (y tick labels) and its legend entries."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        legend = ax.get_legend()
        out.append(max(len(labels), len(legend.get_texts()) if legend else 0))
    return out


def many_runs_db(root: Path, n_runs: int = 25) -> Path:
    """One family with `n_runs` runs (a seed sweep, say), each an RL run started from one SFT run."""
    runs = {"sft": ("fam", "sft", nq([0.0, 1.0, 0.0, 1.0]))}
    lineage = {"sft": {"family": "fam", "step": "sft"}}
    for i in range(n_runs):
        em = [float((i + j) % 2) for j in range(4)]
        runs[f"rl_seed{i}"] = ("fam", "rl", nq(em), [{"step": 0, "reward_mean": 0.1 * i}])
        lineage[f"rl_seed{i}"] = {"family": "fam", "step": "rl", "start_run": "sft"}
    return build(root, runs, lineage, [])


@pytest.mark.slow
def test_figures_are_written_and_readable(paired_db, tmp_path):
    out = tmp_path / "plots"
    paths = [plot_metrics(paired_db, out, "em"), plot_paired(paired_db, out, "em"),
             plot_reward_curves(paired_db, out), *plot_families(paired_db, out), *plot_training(paired_db, out)]
    assert sorted(p.name for p in paths) == ["family_kg.png", "family_search.png", "metrics_em.png", "paired_em.png",
                                             "reward_curves.png", "search_rl_training.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no temp files left
    for p in paths:
        width, height = png_size(p)
        assert width <= 2000 and height <= 2000, (p.name, width, height)
    family = family_figure(paired_db, "search")
    # Runs in pipeline order on the left; the forest's rows are the pairs, with a line at 0.
    runs_ax, forest_ax = family.axes[0], family.axes[1]
    assert [t.get_text() for t in runs_ax.get_yticklabels()] == ["base", "search_sft", "search_rl", "search_oracle"]
    assert [t.get_text() for t in forest_ax.get_yticklabels()] == [
        "search_sft − base (sft vs base)", "search_rl − search_sft (rl vs sft)", "search_oracle − search_rl (oracle vs rl)"]
    assert any(list(line.get_xdata()) == [0, 0] for line in forest_ax.get_lines())


def test_a_linked_run_of_another_family_is_drawn_on_the_familys_datasets_only(paired_db):
    # kg_sft started from base, but base answered nq and kg_sft kgqa: no row for base.
    fig = family_figure(paired_db, "kg")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["kg_sft"]
    assert fig.axes[0].get_title() == "em · kgqa"


@pytest.mark.slow
def test_a_large_family_is_split_into_readable_panels(tmp_path):
    db = many_runs_db(tmp_path)
    for fig in (metrics_figure(db, "em"), paired_figure(db, "em"), family_figure(db, "fam"), reward_curves_figure(db)):
        counts = panel_series(fig)
        assert counts and max(counts) <= MAX_ROWS, counts
        width, height = fig.get_size_inches() * fig.dpi
        assert width <= 2000, width
    # All 26 runs are still drawn, split over panels of at most MAX_ROWS.
    assert sum(panel_series(metrics_figure(db, "em"))) == 26
    assert sum(panel_series(paired_figure(db, "em"))) == 25


def test_reward_curves_show_raw_smoothed_and_tied_share(paired_db):
    fig = reward_curves_figure(paired_db)
    ax = fig.axes[0]
    assert ax.get_title() == "search_rl"
    raw, smooth = ax.get_lines()[:2]
    assert list(raw.get_ydata()) == pytest.approx([0.1 * s for s in range(12)])
    w = smoothing_window(12)
    assert list(smooth.get_ydata()) == pytest.approx(trailing_mean([0.1 * s for s in range(12)], w))
    (tied,) = [line for a in fig.axes for line in a.get_lines() if line.get_label() == "tied-group share"]
    assert list(tied.get_ydata()) == pytest.approx([0.5 - 0.05 * s for s in range(12)])


def test_trailing_mean_by_hand():
    assert trailing_mean([1, 2, 3, 4, 5], 3) == [1, 1.5, 2, 3, 4]
    assert trailing_mean([2, 4], 1) == [2, 4]
    assert smoothing_window(8) == 3 and smoothing_window(100) == 10 and smoothing_window(2) == 2
    with pytest.raises(ValueError):
        trailing_mean([1], 0)


def test_a_log_without_tied_share_says_so(tmp_path):
    runs = {"r": ("x", "rl", nq([1.0, 0.0, 1.0, 0.0]), [{"step": 0, "reward_mean": 0.2}, {"step": 1, "reward_mean": 0.4}])}
    db = build(tmp_path, runs, {}, [])
    fig = reward_curves_figure(db)
    assert any(t.get_text() == "tied-group share not logged" for a in fig.axes for t in a.texts)
    plot_training(db, tmp_path / "plots")
    assert png_size(tmp_path / "plots" / "r_training.png")[0] <= 2000


@pytest.mark.slow
def test_cli_builds_tables_and_plots_from_the_lineage(tmp_path):
    """`ragrl results build --lineage`, `results tables` and `results plots`, as the rules run them."""
    inputs = {k: [] for k in ("runs", "evals", "predictions", "train_logs")}
    for run_id, (recipe, stage, preds, *log) in PAIRED_RUNS.items():
        for key, paths in write_run(tmp_path, run_id, recipe, stage, preds, log[0] if log else None).items():
            inputs[key] += [str(p) for p in paths]
    db = tmp_path / "cli.duckdb"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    run = [sys.executable, "-m", "ragrl", "results"]
    subprocess.run([*run, "build", "--db", str(db), "--runs", *inputs["runs"], "--evals", *inputs["evals"],
                    "--predictions", *inputs["predictions"], "--train-logs", *inputs["train_logs"],
                    "--tables", json.dumps(PAIRED_TABLES), "--lineage", json.dumps(PAIRED_LINEAGE)],
                   check=True, env=env, capture_output=True)
    assert q(db, "SELECT count(*) FROM paired") == [(9,)]
    subprocess.run([*run, "tables", "--db", str(db), "--tables", json.dumps(PAIRED_TABLES), "--out-dir",
                    str(tmp_path / "tables")], check=True, env=env, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == [
        "main.csv", "main.md", "main.tex", "main_delta.csv", "main_delta.md"]
    subprocess.run([*run, "plots", "--db", str(db), "--metrics", "em", "f1", "--out-dir", str(tmp_path / "plots")],
                   check=True, env=env, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "family_kg.png", "family_search.png", "metrics_em.png", "metrics_f1.png", "paired_em.png", "paired_f1.png",
        "reward_curves.png", "search_rl_training.png"]



def test_every_step_of_a_figure_has_its_own_colour():
    # The default run has eleven steps; matplotlib's default cycle has ten colours, so "gold"
    # was drawn in "base"'s blue.
    from types import SimpleNamespace

    from ragrl.results.plots import _step_colors

    for n in (3, 11, 20):
        runs = [f"r{i}" for i in range(n)]
        res = SimpleNamespace(runs=runs, lineage={r: SimpleNamespace(step=f"s{i}") for i, r in enumerate(runs)})
        colors = _step_colors(res)
        assert len(set(colors.values())) == n == len(colors)
