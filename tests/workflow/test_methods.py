"""Methods as plug-ins: the registry, recipe validation before the DAG, and a method added from
outside src/ (tests/plugins/direct_answer.py) run through the whole workflow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ragrl.methods import Method, builtin_names, get_method, load_plugin
from ragrl.recipe import parse_recipe, stage_keys
from ragrl.workflow.pipelines import builtin_pipelines
from helpers import REPO, TINY, run_snakemake

PLUGIN = REPO / "tests/plugins/direct_answer.py"
# The generic layers: they look methods up and must never branch on one's name.
GENERIC = [*sorted((REPO / "src/ragrl/cli").glob("*.py")), REPO / "Snakefile",
           *sorted((REPO / "src/ragrl/stages").glob("*.py")),
           *sorted((REPO / "src/ragrl/eval").glob("*.py")), *sorted((REPO / "rules").glob("*.smk")),
           *sorted((REPO / "src/ragrl/verl").glob("*.py"))]


def _name_branches(lines) -> list[tuple[int, str]]:
    """(line number, line) of every comparison against a built-in method name in `lines`."""
    names = "|".join(re.escape(n) for n in builtin_names())
    quoted = rf"""["']({names})["']"""
    patterns = [
        rf"(==|!=)\s*{quoted}", rf"{quoted}\s*(==|!=)",  # env == "kg"
        rf"\bin\s*[\(\[{{]\s*{quoted}",  # env in ("search", ...)
        r"""env["']?\]?\s*(==|!=|\bin\b)""",  # settings["env"] == ..., recipe.env in ...
        r"multi_query_search",  # the one method name no other concept shares
    ]
    return _code_matching(lines, patterns)


def _code_matching(lines, patterns) -> list[tuple[int, str]]:
    """(line number, line) of every line of `lines` whose code (comments aside) matches a pattern."""
    return [(i, line) for i, line in enumerate(lines, 1)
            if any(re.search(p, line.split("#", 1)[0]) for p in patterns)]


def _offences(paths, check) -> list[str]:
    return [f"{path.relative_to(REPO)}:{i}: {line.strip()}"
            for path in paths for i, line in check(path.read_text().splitlines())]


def test_generic_layers_never_name_a_method():
    assert _offences(GENERIC, _name_branches) == []


def test_the_name_check_catches_a_branch():
    # The check above must be able to fail: the old CLI's and rules' dispatch lines are caught.
    old = ['if recipe.env == "kg":', 'if settings["env"] != "kg" and x:', 'return env in ("search", "none")',
           'make_environment("multi_query_search", r)', 'x = 1  # env == "kg" in a comment is fine']
    assert [i for i, _ in _name_branches(old)] == [1, 2, 3, 4]


# The generic workflow layers: they ask the enabled pipeline methods' plans (ragrl.workflow.pipelines)
# and must never name one or what only one of them has; each pipeline's own rule file may.
PIPELINE_RULES = {Path(p.rules).name for p in builtin_pipelines()}
WORKFLOW_GENERIC = [REPO / "Snakefile", *(p for p in sorted((REPO / "rules").glob("*.smk")) if p.name not in PIPELINE_RULES),
                    *(REPO / "src/ragrl/workflow" / f for f in ("__init__.py", "core.py", "table.py", "checks.py",
                                                                 "lineage.py", "resources.py"))]


def _pipeline_names(lines) -> list[tuple[int, str]]:
    """(line number, line) of every line of code in `lines` naming a built-in pipeline or its parts."""
    names = "|".join(re.escape(p.name) for p in builtin_pipelines())
    return _code_matching(lines, [rf"\b({names})(\b|_)", r"\bHARR_", r"\b(HarrPlan|GraphPlan)\b", r"\bgraphs\b",
                                  r"graph_rank", r"kg_built", r"""\bstage\b.*["']graph["']"""])


def test_generic_layers_never_name_a_pipeline():
    assert _offences(WORKFLOW_GENERIC, _pipeline_names) == []


def test_the_pipeline_name_check_catches_them():
    # The generic layers' lines before pipelines were plug-ins are caught.
    old = ["self.harr = HarrPlan(self)", "runs=WF.run_manifests() + WF.harr.manifests() + WF.graphs.manifests(),",
           'if run.stage in ("oracle", "graph"):', "errors += construct_kg_errors(wf)", "from ragrl.recipe import HARR_RUNS",
           'if path.startswith(f"{RESULTS}/kg_built/"):', "x = 1  # harr in a comment is fine"]
    assert [i for i, _ in _pipeline_names(old)] == [1, 2, 3, 4, 5, 6]


def test_builtin_methods_and_their_declarations():
    for name in builtin_names():
        method = get_method(name)
        assert isinstance(method, Method) and method.name == name
        assert set(method.default_reward) <= set(method.reward_keys)
    assert get_method("kg").inputs == ("graph",) and get_method("search").inputs == ("retriever",)
    assert "verl" in get_method("multi_query_search").rl_backends and get_method("kg").rl_backends == ("local",)
    assert get_method("search").sft_sources == ("gold", "teacher", "import")
    with pytest.raises(ValueError, match="unknown method .*'browse'.*plugin"):
        get_method("browse")


def test_plugin_loads_by_path_and_name_is_checked():
    assert get_method("direct_answer", str(PLUGIN)).reward_keys == ("em", "brevity")
    assert load_plugin(str(PLUGIN)).METHOD is get_method("direct_answer")
    with pytest.raises(ValueError, match="defines method 'direct_answer', not 'other'"):
        get_method("other", str(PLUGIN))
    with pytest.raises(FileNotFoundError):
        load_plugin("tests/plugins/missing.py")


def test_schema_documents_every_recipe_key():
    schema = yaml.safe_load((REPO / "config/schemas/config.schema.yaml").read_text())
    recipe = schema["properties"]["recipes"]["additionalProperties"]["properties"]
    for section, keys in stage_keys().items():
        assert set(recipe[section]["properties"]) == set(keys), section
        assert recipe[section]["additionalProperties"] is False


@pytest.mark.slow
@pytest.mark.parametrize("section,bad,needle", [
    ("rollout", {"max_turnz": 2}, "recipes.search_r1.rollout.max_turnz"),
    ("sft", {"epohcs": 1}, "recipes.search_r1.sft.epohcs"),
    ("rl", {"stepz": 3}, "recipes.search_r1.rl.stepz"),
    ("reward", {"emm": 1.0}, "recipes.search_r1.reward"),
    ("turn_reward", {"format": 0.1}, "recipes.search_r1.turn_reward"),
    ("options", {"max_hops": 2}, "recipes.search_r1.options"),
    ("rl", {"lr": -1.0}, "recipes.search_r1.rl.lr"),
    ("sft", {"source": "teacher"}, "recipes.search_r1.sft.teacher"),
])
def test_misspelled_recipe_key_fails_the_dry_run(tmp_path, section, bad, needle):
    cfg = json.loads(json.dumps(TINY))
    cfg["recipes"]["search_r1"][section] = {**cfg["recipes"]["search_r1"].get(section, {}), **bad}
    proc = run_snakemake(tmp_path, cfg, "-n")
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_gold_sft_on_a_real_dataset_fails_the_dry_run_saying_what_to_set(tmp_path):
    cfg = json.loads(json.dumps(TINY))
    cfg["datasets"]["hotpotqa_example"] = {"format": "hotpotqa", "path": "resources/fixtures/qa/hotpotqa.json"}
    cfg["recipes"]["search_r1"]["train_dataset"] = "hotpotqa_example"
    proc = run_snakemake(tmp_path, cfg, "-n")
    assert proc.returncode != 0
    out = proc.stderr + proc.stdout
    assert "recipes.search_r1.sft.source" in out and "sft.source: teacher" in out and "sft.source: import" in out


def test_parse_recipe_checks_every_section_with_values():
    with pytest.raises(ValueError, match="recipes.x.rl'.*must be >= 1"):
        parse_recipe({"env": "search", "rl": {"steps": 0}}, "x")
    with pytest.raises(ValueError, match="recipes.x.options'.*max_hops"):
        parse_recipe({"env": "kg", "options": {"max_hops": 0}}, "x")
    with pytest.raises(ValueError, match="recipes.x.options'.*readable_copies='yes' must be true or false"):
        parse_recipe({"env": "kg", "options": {"readable_copies": "yes"}}, "x")
    with pytest.raises(ValueError, match="recipes.x.rollout'.*forced_answer_prefill=0 must be true or false"):
        parse_recipe({"env": "search", "rollout": {"forced_answer_prefill": 0}}, "x")
    with pytest.raises(ValueError, match="rl.backend'.*'verl' is not supported by method 'kg'"):
        parse_recipe({"env": "kg", "rl": {"backend": "verl"}}, "x")
    recipe = parse_recipe({"env": "search", "sft": {"source": "import", "import": {"path": "x.json"}}}, "x")
    assert parse_recipe(recipe.to_config(), "x") == recipe


def test_flags_must_be_booleans_whatever_their_annotation(tmp_path):
    """`bool | None` (SFTArgs.bf16) and a plug-in's `Optional[bool]` are flags too: a string or a
    number is refused, None passes where the field allows it."""
    from ragrl.recipe import sft_args

    with pytest.raises(ValueError, match="recipes.x.sft'.*bf16='yes' must be true or false"):
        sft_args(parse_recipe({"env": "search", "sft": {"bf16": "yes"}}, "x"))
    assert sft_args(parse_recipe({"env": "search", "sft": {"bf16": None}}, "x")).bf16 is None
    plugin = tmp_path / "flagged.py"
    plugin.write_text(
        "import dataclasses\nfrom typing import Optional\nfrom ragrl.methods import load_plugin\n\n"
        "@dataclasses.dataclass(frozen=True)\nclass Flags:\n    strict: Optional[bool] = None\n\n"
        f"METHOD = dataclasses.replace(load_plugin({str(PLUGIN)!r}).METHOD, name='flagged_options', options=Flags)\n")
    with pytest.raises(ValueError, match="recipes.x.options'.*strict=1 must be true or false"):
        parse_recipe({"env": "flagged_options", "plugin": str(plugin), "options": {"strict": 1}}, "x")
    assert parse_recipe({"env": "flagged_options", "plugin": str(plugin), "options": {"strict": None}}, "x"
                        ).options.strict is None


def _plugin_config() -> dict:
    cfg = json.loads(json.dumps(TINY))
    cfg["recipes"] = {"direct": {
        "env": "direct_answer", "plugin": str(PLUGIN), "train_dataset": "world_train",
        "rollout": {"max_turns": 0, "max_turn_tokens": 32, "temperature": 1.0},
        "sft": {"limit": 16, "epochs": 1, "batch_size": 4, "lr": 0.003},
        "rl": {"steps": 2, "batch_prompts": 2, "group_size": 2, "checkpoint_every": 1, "lr": 1e-4},
        "reward": {"em": 1.0, "brevity": 0.2},
    }}
    cfg["retrieval"]["eval"]["datasets"] = []
    cfg["evaluation"]["baselines"] = False
    cfg["results"]["tables"] = [{"name": "direct_em", "metric": "em", "runs": ["direct_sft", "direct_rl"],
                                 "datasets": ["world_test"]}]
    return cfg


@pytest.mark.integration
def test_a_method_from_outside_src_runs_through_the_workflow(tmp_path):
    """sft_data → sft → rl → eval → results for a plug-in that no file under src/ or rules/ names."""
    proc = run_snakemake(tmp_path, _plugin_config())
    assert proc.returncode == 0, proc.stderr[-3000:]
    import duckdb

    con = duckdb.connect(str(tmp_path / "results/ragrl.duckdb"), read_only=True)
    runs = con.execute("select run_id, dataset from leaderboard order by 1").fetchall()
    assert runs == [("direct_rl", "world_test"), ("direct_sft", "world_test")]
    # The plug-in's own reward component reached the training log, step by step.
    brevity = con.execute("select count(reward_brevity) from train_log where run_id = 'direct_rl'").fetchone()[0]
    assert brevity == 2
    # Its environment ran: closed book, one answer turn, no searches.
    assert con.execute("select max(searches), max(turns) from predictions").fetchone() == (0, 1)
    assert "direct_rl" in (tmp_path / "results/tables/direct_em.md").read_text()
    assert "--recipe" in Path(tmp_path / "logs/sft_data/direct.log").read_text().splitlines()[0]


def test_every_stage_part_of_a_default_recipe_parses():
    """Each rule passes only its part of a recipe (rules/common.smk recipe_part); every part,
    the baselines' closed-book settings included, must still be a valid recipe for its job."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    for name, settings in cfg["recipes"].items():
        eval_part = {k: v for k, v in settings.items() if k not in ("sft", "rl", "reward", "turn_reward",
                                                                  "train_dataset", "eval_datasets")}
        parse_recipe(eval_part, name)
        if get_method(settings["env"]).baselines:  # as runs() builds the no_retrieval run
            closed = {k: v for k, v in eval_part.items() if k not in ("options", "plugin")}
            parse_recipe({**closed, "env": "none"}, name)


QA_COUNT = REPO / "tests/plugins/qa_count.py"


@pytest.mark.integration
def test_a_pipeline_from_outside_src_runs_through_the_workflow(tmp_path):
    """A pipeline method that no file under src/ or rules/ names: config enables it, the default
    target plans its rule, its check fails the dry run, its job runs."""
    cfg = json.loads(json.dumps(TINY))
    cfg["pipelines"] = {"qa_count": {"plugin": str(QA_COUNT), "dataset": "nope"}}
    proc = run_snakemake(tmp_path, cfg, "-n")
    assert proc.returncode != 0 and "config key 'pipelines.qa_count.dataset': 'nope'" in proc.stdout + proc.stderr
    cfg["pipelines"]["qa_count"]["dataset"] = "world_test"
    proc = run_snakemake(tmp_path, cfg, "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^qa_count\s+1$", proc.stdout, re.M), proc.stdout
    proc = run_snakemake(tmp_path, cfg, "results/qa_count/world_test.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pyarrow.parquet as pq

    questions = pq.read_table(tmp_path / "results/world/qa/test.parquet").num_rows
    assert json.loads((tmp_path / "results/qa_count/world_test.json").read_text()) == {"questions": questions} != {"questions": 0}
