"""The paper configs (config/paper/*.yaml) resolve the whole DAG through the SLURM profile.

`snakemake -n --profile slurm --configfile config/paper/<method>.yaml`, run from the repository
root as users type it (the bare name finds the `slurm` symlink to profiles/slurm), with
`--directory <tmp>` so nothing is written to the checkout, must plan every stage
(corpus → embeddings → index → [SFT] → RL → merge → eval → results) in seconds, with no cluster.

Two things a dry run needs that this machine lacks, provided in the temp dir only:
- the input data: Snakemake 9 refuses a plan whose source files (inputs no rule makes, here the
  corpora and QA sets under data/) are missing (MissingInputException, checked below), so the
  test creates empty placeholders for exactly the files the config names;
- conda: the profile sets `software-deployment-method: conda`, and Snakemake then runs
  `conda info --json` / `conda --version` even for a dry run. Conda cannot run here (DESIGN §7),
  so a stub `conda` answering just those queries goes first on PATH; a dry run creates no envs.
HF_HUB_OFFLINE is unset for the dry run: HF ids are checked by name (ragrl.models), and with the
hub reachable they are accepted without a download; nothing is fetched by a dry run.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The search-agent papers share one shape (corpus, dense index, one recipe); KG-R1, KnowRL (no
# retrieval: a KB inside the reward) and HARR (no policy trained: the retriever is) have their own tests.
PAPER = sorted(p for p in (REPO / "config/paper").glob("*.yaml")
               if p.stem not in ("kg_r1", "harr", "knowrl", "autograph_r1"))
KG_PAPER = REPO / "config/paper/kg_r1.yaml"
HARR_PAPER = REPO / "config/paper/harr.yaml"
KNOWRL_PAPER = REPO / "config/paper/knowrl.yaml"
AUTOGRAPH_PAPER = REPO / "config/paper/autograph_r1.yaml"
DATASETS = ["nq_test", "triviaqa_test", "popqa_test", "hotpotqa_dev", "2wiki_dev", "musique_dev", "bamboogle_test"]

_FAKE_CONDA = """#!/bin/sh
case "$*" in
  "info --json") echo '{"conda_prefix": "%(prefix)s", "platform": "linux-64"}' ;;
  "--version") echo "conda 25.1.1" ;;
  "config --get channel_priority --json") echo '{"get": {"channel_priority": "strict"}}' ;;
  *) echo "stub conda (tests/workflow/test_paper_configs.py): unexpected call: $*" >&2; exit 1 ;;
esac
"""


def _merged(paper: Path) -> dict:
    """What the workflow sees: the default config, the paper config over it, null entries removed."""
    from snakemake.utils import update_config

    from ragrl.config import drop_null_entries

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load(paper.read_text()))
    return drop_null_entries(config)


def _source_files(config: dict) -> list[str]:
    files = [f for spec in config["corpora"].values() for f in spec["inputs"]]
    # A mixed QA set lists its files (one per format).
    files += [f for spec in config["datasets"].values()
              for f in (spec["path"] if isinstance(spec["path"], list) else [spec["path"]])]
    files += [r["sft"]["import"]["path"] for r in config["recipes"].values() if r["sft"].get("source") == "import"]
    files += [f for spec in config.get("kbs", {}).values() for f in spec["inputs"]]
    return files


def _dry_run(paper: Path, workdir: Path, placeholders: bool = True,
             overlay: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    if placeholders:
        for rel in _source_files(_merged(paper)):
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).touch()
        for spec in _merged(paper).get("kgs", {}).values():  # KG directories (simple KGQA format)
            (workdir / spec["path"]).mkdir(parents=True, exist_ok=True)
    stub = workdir / "_bin"
    stub.mkdir(exist_ok=True)
    (stub / "conda").write_text(_FAKE_CONDA % {"prefix": workdir / "_conda"})
    (stub / "conda").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(SLURM_ACCOUNT="test_account", SLURM_PARTITION="test_gpu",
               PATH=f"{stub}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    configs = [str(paper.relative_to(REPO))]
    if overlay:  # layered over the paper config, as the CPU twins are
        (workdir / "_overlay.yaml").write_text(yaml.safe_dump(overlay))
        configs.append(str(workdir / "_overlay.yaml"))
    start = time.monotonic()
    proc = subprocess.run(
        [SNAKEMAKE, "-n", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--profile", "slurm", "--configfile", *configs],
        cwd=REPO, capture_output=True, text=True, env=env, timeout=300,
    )
    return proc, time.monotonic() - start


def _job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(?m)^(\w+)\s+(\d+)\s*$", table)}


def _job_block(output: str, rule: str) -> str:
    m = re.search(rf"(?ms)^rule {rule}:\n(.*?)(?=^\S|\Z)", output)
    assert m, f"no `rule {rule}:` job in the plan"
    return m.group(1)


def _assert_gpu_rules_request_gpus(out: str, config: dict, counts: dict[str, int]) -> None:
    """Every planned rule whose `resources.rules` entry asks for GPUs carries that request (and the
    model) into its job, which the SLURM plugin turns into --gpus=<model>:N."""
    gpu_rules = {rule: spec for rule, spec in config["resources"]["rules"].items() if spec.get("gpu", 0) > 0}
    planned = [rule for rule in gpu_rules if counts.get(rule)]
    assert planned, f"no GPU rule planned: {counts}"
    for rule in planned:
        block = _job_block(out, rule)
        assert f"gpu={gpu_rules[rule]['gpu']}" in block, f"{rule} does not request its GPUs: {block}"
        if "gpu_model" in gpu_rules[rule]:
            assert f"gpu_model={gpu_rules[rule]['gpu_model']}" in block, block


@pytest.mark.slow
def test_slurm_profile_name_resolves_to_repo_profile(monkeypatch):
    # The literal `--profile slurm`, looked up as Snakemake does (working directory first), is
    # profiles/slurm and not the test cluster's profile or one in ~/.config/snakemake.
    from snakemake.cli import get_profile_dir

    monkeypatch.chdir(REPO)
    found = get_profile_dir("slurm")
    assert found is not None, "`--profile slurm` does not resolve from the repository root"
    assert found[1].resolve() == (REPO / "profiles/slurm/config.yaml").resolve()


def test_paper_configs_present():
    assert {p.stem for p in PAPER} >= {"search_r1", "rag_r1"}


def _assert_sources_are_user_data(config: dict) -> None:
    # Real corpora and QA sets come from the user's data/ dir; no toy entry leaks from the default.
    assert all(f.startswith("data/") for f in _source_files(config)), _source_files(config)
    assert not any(name.startswith("world") or name.endswith("_example") for name in [*config["corpora"], *config["datasets"]])


@pytest.mark.parametrize("paper", PAPER, ids=lambda p: p.stem)
def test_sources_are_user_data(paper):
    config = _merged(paper)
    _assert_sources_are_user_data(config)
    assert list(config["recipes"]) == [paper.stem]
    assert config["models"]["policy"].startswith("Qwen/Qwen2.5-")
    assert set(config["evaluation"]["datasets"]) == set(DATASETS)


@pytest.mark.parametrize("paper", PAPER, ids=lambda p: p.stem)
def test_recipe_settings_are_accepted(paper):
    # Every recipe setting maps onto the typed stage configs (unknown keys fail there).
    sys.path.insert(0, str(REPO / "src"))
    from ragrl.recipe import parse_recipe, rl_config, sft_args

    config = _merged(paper)
    for name, settings in config["recipes"].items():
        recipe = parse_recipe(copy.deepcopy(settings), name)
        rl = rl_config(recipe)
        assert rl.lr == 1e-6 and rl.kl_coef == 0.001 and recipe.topk == 3 and recipe.rollout.max_turns == 4
        if settings["sft"].get("enabled", True):
            sft_args(recipe)


@pytest.mark.slow
@pytest.mark.parametrize("paper", PAPER, ids=lambda p: p.stem)
def test_dry_run_resolves_whole_dag(paper, tmp_path):
    proc, seconds = _dry_run(paper, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "This was a dry-run" in out
    assert seconds < 60, f"dry run took {seconds:.1f} s"
    counts = _job_counts(out)
    config = _merged(paper)
    recipe = paper.stem
    sft = config["recipes"][recipe]["sft"].get("enabled", True)
    runs = 2 + (2 if sft else 1)  # base, no_retrieval, [<recipe>_sft], <recipe>_rl
    expected = {"corpus": 1, "qa": len(config["datasets"]), "embed_shard": config["retrieval"]["shards"],
                "index": 1, "rl": 1, "merge_rl": 1, "eval": runs, "run_manifest": runs,
                "results_db": 1, "results_tables": 1, "results_plots": 1}
    if sft:
        expected.update(sft_data=1, sft=1, merge_sft=1)
    for rule, n in expected.items():
        assert counts.get(rule) == n, f"{rule}: {counts.get(rule)} jobs planned, expected {n}; plan: {counts}"
    assert "bm25" not in counts  # dense retrieval only, as in the papers
    # The cluster resources reach the SLURM executor: RL on one 8-GPU node, account from the env.
    rl = _job_block(out, "rl")
    for field in ("gpu=8", "gpu_model=a100", "nodes=1", "slurm_account=test_account", "slurm_partition=test_gpu"):
        assert field in rl, f"rl job lacks {field}: {rl}"
    # RL starts from the base policy (Search-R1: no SFT) or from the merged SFT model (RAG-R1).
    start = f"results/models/{recipe}/sft_merged" if sft else config["models"]["policy"]
    assert re.search(rf"python -m ragrl rl .* --policy {re.escape(start)} ", out), "rl starts elsewhere"
    assert "gpu=1" in _job_block(out, "eval") and "gpu=1" in _job_block(out, "embed_shard")
    _assert_gpu_rules_request_gpus(out, config, counts)
    assert (tmp_path / ".snakemake").is_dir()  # Snakemake's state went to the temp dir


@pytest.mark.slow
def test_retrieval_gpu_reaches_every_dense_retrieval_command(tmp_path):
    # retrieval.gpu: the index build, the in-process search of RL and evaluation, and the
    # retrieval evaluation put FAISS and the query encoder on the job's GPUs (--gpu).
    proc, _ = _dry_run(REPO / "config/paper/search_r1.yaml", tmp_path, overlay={"retrieval": {"gpu": True}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for command in ("index build", "rl", "eval"):
        # Commands that read a dense index (not the closed-book baseline, which reads none).
        lines = [ln for ln in out.splitlines() if f"python -m ragrl {command} " in ln
                 and ("--index " in ln or command == "index build")]
        assert lines and all(" --gpu " in ln for ln in lines), f"`ragrl {command}` without --gpu: {lines[:2]}"


@pytest.mark.slow
def test_missing_data_is_reported_not_planned(tmp_path):
    # Without the user's data the plan stops at the first missing source file, naming it.
    paper = REPO / "config/paper/search_r1.yaml"
    proc, _ = _dry_run(paper, tmp_path, placeholders=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "MissingInputException" in out and "data/" in out, out[-2000:]


@pytest.mark.slow
def test_kg_r1_paper_config_resolves_train_and_transfer_evaluations(tmp_path):
    """KG-R1: one RL run per training KGQA set, each evaluated in-domain and zero-shot on the
    other KGs; every evaluation reads the KG its dataset names (the swapped KG server)."""
    config = _merged(KG_PAPER)
    assert set(config["recipes"]) == {"kg_r1_webqsp", "kg_r1_cwq"} and not any(k.startswith("world") for k in config["kgs"])
    sys.path.insert(0, str(REPO / "src"))
    from ragrl.recipe import parse_recipe, rl_config

    for name, settings in config["recipes"].items():
        recipe = parse_recipe(copy.deepcopy(settings), name)
        rl = rl_config(recipe)
        assert (rl.group_size, rl.lr, rl.kl_coef, recipe.rollout.max_turns) == (16, 1e-6, 0.01, 7)
        assert recipe.env == "kg" and rl.turn_advantage_weight == 0.5
    proc, seconds = _dry_run(KG_PAPER, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert seconds < 60, f"dry run took {seconds:.1f} s"
    counts = _job_counts(out)
    _assert_gpu_rules_request_gpus(out, config, counts)
    # One evaluation job per RL run, on all of its datasets.
    assert counts.get("rl") == 2 and counts.get("eval") == 2 and "sft" not in counts, counts
    assert re.search(r"ragrl eval .*--dataset trex_test --qa \S+ --kg data/kgqa/trex --kg-mode subgraph "
                     r".*--run-id kg_r1_webqsp_rl", out), "the transfer evaluation does not read the T-REx KG"


@pytest.mark.slow
def test_harr_paper_config_trains_the_retriever_with_a_served_generator(tmp_path):
    """HARR: no policy recipe; filter -> two encoder trainings -> four evaluated runs x three sets,
    every HARR job with the published Search-R1 checkpoint behind the vLLM server it starts, the
    authors' settings, and the GPUs the cluster profile asks for."""
    config = _merged(HARR_PAPER)
    assert config["recipes"] == {}
    _assert_sources_are_user_data(config)
    sys.path.insert(0, str(REPO / "src"))
    from ragrl.recipe import parse_harr

    harr = parse_harr(copy.deepcopy(config["harr"]))
    assert (harr.train.steps, harr.train.questions_per_step, harr.train.group_size, harr.train.lr, harr.train.alpha,
            harr.environment.pool_size, harr.environment.topk, harr.encoder.lora_r, harr.encoder.lora_alpha) == (
        100, 16, 8, 1e-5, 0.05, 30, 3, 32, 64)
    assert config["models"]["embedding"] == "Qwen/Qwen3-Embedding-0.6B" and harr.recall_k == ()
    assert harr.train_mix is None  # the toy default's bridge-only training must not reach HotpotQA
    proc, seconds = _dry_run(HARR_PAPER, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert seconds < 60, f"dry run took {seconds:.1f} s"
    counts = _job_counts(out)
    expected = {"corpus": 1, "qa": 4, "embed_shard": 16, "index": 1, "harr_filter": 1, "harr_train": 2,
                "harr_eval": 12, "harr_manifest": 4, "results_db": 1, "results_tables": 1}
    for rule, n in expected.items():
        assert counts.get(rule) == n, f"{rule}: {counts.get(rule)} jobs planned, expected {n}; plan: {counts}"
    for rule in ("harr_recall", "rl", "sft", "eval", "pretrain", "tiny_model", "policy_generate"):
        assert rule not in counts, counts
    _assert_gpu_rules_request_gpus(out, config, counts)
    model = config["harr"]["generator"]["model"]
    commands = [ln for ln in out.splitlines() if re.search(r"python -m ragrl harr-(filter|train|eval) ", ln)]
    assert len(commands) == 1 + 2 + 12, len(commands)  # filter, two trainings, 4 runs x 3 sets
    for line in commands:
        assert f"--generator {model} " in line and "--generator-endpoint" in line and '"serve"' in line, line
        assert "--server-log logs/harr/serve/" in line, line


@pytest.mark.slow
def test_knowrl_paper_config_resolves_sft_rl_and_simpleqa_evaluation(tmp_path):
    """KnowRL: their KB taken as is, their cold-start file imported, GRPO with the paper's reward
    and judge settings, the untrained, SFT and RL policies graded on their README's five benchmarks
    (SimpleQA, TruthfulQA, Chinese SimpleQA, GPQA, AIME)."""
    config = _merged(KNOWRL_PAPER)
    assert list(config["recipes"]) == ["knowrl"] and list(config["kbs"]) == ["knowrl"]
    _assert_sources_are_user_data(config)
    sys.path.insert(0, str(REPO / "src"))
    from ragrl.recipe import parse_recipe, rl_config, sft_args

    recipe = parse_recipe(copy.deepcopy(config["recipes"]["knowrl"]), "knowrl")
    rl, sft, opts = rl_config(recipe), sft_args(recipe), recipe.options
    assert (rl.group_size, rl.lr, rl.kl_coef, rl.steps, rl.batch_prompts, rl.seed) == (10, 1e-5, 0.001, 150, 8, 42)
    assert (sft.lora_r, sft.lora_alpha, sft.lr, sft.epochs) == (256, 512, 1e-4, 4)
    assert (opts.factscore, opts.grader, opts.gamma, opts.top_k, opts.nli_threshold) == ("paper", "llm", 10, 5, 0.3)
    assert recipe.rollout.max_turns == 0 and recipe.reward == {"format": 1.0, "correct": 1.0, "fact": 1.0}
    proc, seconds = _dry_run(KNOWRL_PAPER, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert seconds < 60, f"dry run took {seconds:.1f} s"
    counts = _job_counts(out)
    # qa: the RL data and the five benchmarks; eval: one job per policy, every benchmark in it
    expected = {"kb": 1, "qa": 6, "sft_data": 1, "sft": 1, "rl": 1, "eval": 3, "results_db": 1}
    for rule, n in expected.items():
        assert counts.get(rule) == n, f"{rule}: {counts.get(rule)} jobs planned, expected {n}; plan: {counts}"
    for rule in ("corpus", "index", "embed_shard", "pretrain", "tiny_model", "harr_train"):
        assert rule not in counts, counts
    _assert_gpu_rules_request_gpus(out, config, counts)
    # The KB is an input of every job whose reward or metrics read it.
    assert re.search(r"(?s)rule rl:.*?input: [^\n]*results/kb/knowrl/knowledge_base.db", out)


@pytest.mark.slow
def test_autograph_r1_paper_config_trains_both_rewards_with_served_models(tmp_path):
    """AutoGraph-R1: MuSiQue + HotpotQA mixed, no cold start, GRPO with R_I and with R_C, the judge
    and the reward's embedder served by vLLM servers the jobs start, then a KG from the dev
    paragraphs per constructor and PPR recall over each."""
    config = _merged(AUTOGRAPH_PAPER)
    assert list(config["recipes"]) == ["autograph_r1_index", "autograph_r1_carrier"]
    _assert_sources_are_user_data(config)
    assert config["models"]["policy"] == "Qwen/Qwen2.5-3B-Instruct"
    assert config["datasets"]["musique_hotpotqa_train"]["format"] == ["musique", "hotpotqa"]
    sys.path.insert(0, str(REPO / "src"))
    from ragrl.recipe import parse_recipe, rl_config

    index = parse_recipe(copy.deepcopy(config["recipes"]["autograph_r1_index"]), "autograph_r1_index")
    carrier = parse_recipe(copy.deepcopy(config["recipes"]["autograph_r1_carrier"]), "autograph_r1_carrier")
    for recipe, batch in ((index, 16), (carrier, 64)):
        rl = rl_config(recipe)
        assert (rl.group_size, rl.lr, rl.kl_coef, rl.steps, rl.batch_prompts) == (5, 1e-6, 0.0, 50, batch)
        assert recipe.options.embedding_endpoint["model"] == "Qwen/Qwen3-Embedding-0.6B"
        assert "--runner" in recipe.options.embedding_endpoint["serve"]["args"]
        assert not recipe.sft.get("enabled", True)
    assert (index.options.reward, index.options.negatives, index.options.recall_k, index.options.top_triples) == \
        ("index", 15, 5, 10)
    assert (carrier.options.reward, carrier.options.judge, carrier.options.hops) == ("carrier", "openai", 3)
    assert carrier.options.judge_endpoint["model"] == "Qwen/Qwen2.5-7B-Instruct"
    proc, seconds = _dry_run(AUTOGRAPH_PAPER, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert seconds < 60, f"dry run took {seconds:.1f} s"
    counts = _job_counts(out)
    # Two corpora (training + dev paragraphs, dev for the corpus KGs); three QA sets; two RL runs;
    # eval of <recipe>_base and <recipe>_rl per recipe; three corpus KGs (base, index, carrier)
    # ranked on two datasets.
    expected = {"corpus": 2, "qa": 3, "rl": 2, "merge_rl": 2, "eval": 4, "construct_kg": 3, "graph_rank": 6,
                "results_db": 1, "results_tables": 1}
    for rule, n in expected.items():
        assert counts.get(rule) == n, f"{rule}: {counts.get(rule)} jobs planned, expected {n}; plan: {counts}"
    for rule in ("sft", "sft_data", "pretrain", "tiny_model", "kb", "harr_train", "bm25"):
        assert rule not in counts, counts
    _assert_gpu_rules_request_gpus(out, config, counts)
    # One corpus job reads both formats, one QA job mixes both files.
    assert re.search(r"ragrl corpus --format musique hotpotqa musique hotpotqa --inputs", out), out[-3000:]
    assert re.search(r"ragrl qa --format musique hotpotqa --input data/musique/\S+ data/hotpotqa/\S+", out)
    # The RL starts from the instruct model: no cold start.
    assert re.search(r"python -m ragrl rl .* --policy Qwen/Qwen2.5-3B-Instruct ", out), "rl starts elsewhere"
