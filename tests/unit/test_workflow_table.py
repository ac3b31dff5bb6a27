"""ragrl.workflow without Snakemake running: validation of hand-made bad configs, the run table of
the default and a paper config, lineage edges and the HARR runs.

The configs are built as rules/common.smk builds them: config/config.yaml, overlays merged key by
key, null entries dropped, the schema's defaults filled in (Snakemake's validate, used here only as
the library function that fills them; no workflow is planned).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from ragrl.config import config_errors
from ragrl.errors import InputError
from ragrl.workflow import ROLLOUT_KEYS, Run, Workflow, lineage, normalise, recipe_part, run_families, validate

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config/schemas/config.schema.yaml"
DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())


def merged(*overlays: dict) -> dict:
    """The default config with `overlays` merged over it, as the workflow sees it."""
    from snakemake.utils import update_config
    from snakemake.utils import validate as fill_defaults

    config = copy.deepcopy(DEFAULT)
    for overlay in overlays:
        update_config(config, copy.deepcopy(overlay))
    normalise(config)
    if not config_errors(config, SCHEMA):  # Snakemake's validate fails on them without naming the key
        fill_defaults(config, schema=str(SCHEMA), set_default=True)
    return config


def paper(name: str) -> dict:
    return yaml.safe_load((REPO / f"config/paper/{name}.yaml").read_text())


@pytest.fixture(scope="module")
def default() -> Workflow:
    return Workflow(merged())


# ---------------------------------------------------------------- validation


def test_the_shipped_configs_are_valid(monkeypatch):
    # The paper configs name hub ids, which ragrl.models checks by name only while the hub may be
    # reached; `make test` (and test modules at import) set HF_HUB_OFFLINE, under which an id
    # not in the local cache is an error (tests/workflow/test_paper_configs.py unsets it the same way).
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert validate(merged(), SCHEMA) == []
    for name in ("search_r1", "kg_r1", "harr", "knowrl", "autograph_r1", "rag_r1"):
        assert validate(merged(paper(name)), SCHEMA) == [], name


@pytest.mark.parametrize("overlay, needle", [
    ({"wrold": {}}, "config key 'wrold': unknown key"),
    ({"models": {"policy": "nonsense"}}, "config key 'models.policy': unknown model name"),
    ({"datasets": {"q": {"format": "kgqa", "path": "q.jsonl", "kg": "nope"}}}, "config key 'datasets.q.kg'"),
    ({"datasets": {"mix": {"format": ["musique", "hotpotqa"], "path": ["m.jsonl", "h.json", "x.json"]}}},
     "config key 'datasets.mix.format': 2 formats for 3 path (one each, in order)"),
    ({"datasets": {"mix": {"format": ["parquet", "musique"], "path": ["q.parquet", "m.jsonl"]}}},
     "config key 'datasets.mix.format': a QA parquet is used in place"),
    ({"retrieval": {"indexes": {"bm25": "Flat"}}},
     "config key 'retrieval.indexes.bm25': 'bm25' is reserved for the sparse/hybrid retrievers"),
    ({"retrieval": {"indexes": {"bad": "Flatt,Foo"}}}, "config key 'retrieval.indexes.bad': FAISS cannot build"),
    ({"evaluation": {"datasets": ["world_tset"]}},
     "config key 'evaluation.datasets[0]': 'world_tset' is not a key of datasets"),
    ({"recipes": {"search_r1": {"retriever": "nope"}}}, "config key 'recipes.search_r1.retriever': 'nope' is not one of"),
    ({"recipes": {"search_r1": {"rl": {"stepz": 3}}}}, "recipes.search_r1.rl"),
    ({"recipes": {"rag_r1": {"sft": {"from": "kg_r1"}}}},
     "config key 'recipes.rag_r1.sft.from': 'kg_r1' must be another recipe of the same env"),
    ({"datasets": {"hotpotqa_example": {"format": "hotpotqa", "path": "resources/fixtures/qa/hotpotqa.json"}},
      "recipes": {"search_r1": {"train_dataset": "hotpotqa_example"}}},
     "config key 'recipes.search_r1.sft.source': gold (the default) cannot be used"),
    ({"construct_kg": {"reader": "kg_r1_rl"}},
     "config key 'construct_kg.reader': run 'kg_r1_rl' does not search"),
    ({"construct_kg": {"constructors": {"sft": {"run": "nope"}}}},
     "config key 'construct_kg.constructors.sft.run': 'nope' is not an evaluated run"),
    ({"harr": {"generator": "search_r1_typo"}}, "config key 'harr.generator': 'search_r1_typo' is not an evaluated run"),
    ({"harr": {"index": "ivf"}}, "config key 'harr.index': 'ivf' is not a dense index"),
    ({"harr": {"train": {"stepz": 2}}}, "harr.train"),
])
def test_a_bad_config_is_named_by_its_key(overlay, needle):
    errors = validate(merged(overlay), SCHEMA)
    assert any(needle in e for e in errors), errors


def test_validation_reports_every_error_of_a_phase_and_changes_nothing():
    config = merged({"evaluation": {"datasets": ["a", "b"]}, "retrieval": {"eval": {"datasets": ["c"]}}})
    before = copy.deepcopy(config)
    errors = validate(config, SCHEMA)
    assert [e.split(":")[0] for e in errors] == ["config key 'retrieval.eval.datasets[0]'",
                                                  "config key 'evaluation.datasets[0]'",
                                                  "config key 'evaluation.datasets[1]'"]
    assert config == before


def test_the_harr_tables_join_the_configured_ones_without_changing_config(default):
    names = default.table_names()
    assert {"harr_em", "harr_f1", "harr_recall", "harr_all"} <= set(names)
    assert len(names) == len(set(names))
    assert "harr_em" not in {t["name"] for t in default.config["results"]["tables"]}
    assert "harr" not in Workflow(merged({"harr": None})).pipelines


# ---------------------------------------------------------------- the run table


def test_the_default_run_table(default):
    runs = default.runs
    assert all(isinstance(r, Run) and r.id == run_id for run_id, r in runs.items())
    assert list(runs)[:2] == ["base", "no_retrieval"]
    assert {r for r in runs if r.startswith("search_r1")} == {"search_r1_sft", "search_r1_rl", "search_r1_oracle"}
    assert runs["search_r1_rl"].model == "results/models/search_r1/rl_merged"
    assert runs["search_r1_oracle"].model == runs["search_r1_rl"].model
    assert runs["base"].model == default.policy_dir() == "results/models/pretrained"
    # KnowRL's no-fact ablation shares knowrl's SFT start: no SFT or base run of its own.
    assert "knowrl_no_fact_sft" not in runs and "knowrl_no_fact_base" not in runs
    assert default.rl_start_model("knowrl_no_fact") == "results/models/knowrl/sft_merged"
    # A graph reader run is its reader's run answering from one graph's ranking.
    reader = runs["graph_rl_reader"]
    assert (reader.stage, reader.graph, reader.reader, reader.datasets) == ("graph", "rl", "search_r1_rl", ("world_test",))
    assert reader.settings is runs["search_r1_rl"].settings
    assert default.run_datasets("graph_rl_reader") == ["world_test"]
    assert default.run_datasets("base") == default.config["evaluation"]["datasets"]
    # The table is built once: the same object on every call.
    assert default.runs is runs


def test_a_run_needs_what_its_method_reads(default):
    inputs = default.run_inputs("search_r1_oracle")
    assert inputs["model"] == ["results/models/search_r1/rl_merged"]
    assert inputs["passages"] == "results/corpus/world/passages.parquet"
    dataset = default.run_datasets("search_r1_oracle")[0]
    assert inputs[f"{dataset}__qa"] == default.qa_path(dataset)
    graph = default.run_inputs("graph_gold_reader")
    assert graph["ranking"] == "results/graph_rag/graph_gold/world_test/ranking.parquet"
    args = default.run_env_args("graph_gold_reader", graph)
    assert args[:4] == ["--ranking", graph["ranking"], "--passages", graph["passages"]]


def test_a_run_definition_holds_the_stages_behind_its_model(default):
    rl = default.run_definition("search_r1_rl")
    assert set(rl["recipe"]) == {"eval", "sft_data", "sft", "rl"}
    assert set(default.run_definition("base")["recipe"]) == {"eval"}
    assert default.run_definition("graph_sft_reader")["graph"]["sft"]["run"] == default.run_definition("autograph_r1_sft")
    settings = default.recipe("search_r1")
    assert set(recipe_part(settings, "eval")) <= set(ROLLOUT_KEYS)
    assert "sft" not in recipe_part(settings, "rl") and "eval_datasets" not in recipe_part(settings, "rl")


def test_a_paper_config_plans_its_own_runs_only():
    wf = Workflow(merged(paper("search_r1")))
    assert set(wf.runs) == {"base", "no_retrieval", "search_r1_rl"}  # the paper trains no SFT, has no oracle row
    assert wf.pipelines == {}  # neither HARR nor construct_kg
    assert wf.run_datasets("search_r1_rl") == wf.config["evaluation"]["datasets"]
    assert wf.policy_dir() == wf.config["models"]["policy"] and wf.policy_inputs() == []


def test_an_unknown_constructor_is_an_input_error(default):
    with pytest.raises(InputError, match="construct_kg.constructors has no 'nope'"):
        default.pipeline("construct_kg").constructor("nope")


# ---------------------------------------------------------------- lineage


def test_lineage_edges_of_the_default_config(default):
    edges = lineage(default)
    assert edges["search_r1_sft"] == {"family": "search_r1", "step": "sft", "start_run": "base"}
    assert edges["search_r1_rl"]["start_run"] == "search_r1_sft"
    assert edges["search_r1_oracle"]["variant_of"] == "search_r1_rl"
    assert edges["no_retrieval"]["variant_of"] == "base"
    assert edges["knowrl_no_fact_rl"] == {"family": "knowrl", "step": "rl", "start_run": "knowrl_sft",
                                          "ablation_of": "knowrl_rl"}
    assert edges["autograph_r1_sft"]["start_run"] == "autograph_r1_base"
    assert edges["graph_sft"] == {"family": "construct_kg", "step": "sft", "start_run": "graph_base"}
    assert edges["graph_gold"]["variant_of"] == "graph_rl"
    assert edges["graph_gold_reader"] == {"family": "construct_kg", "step": "gold graph", "variant_of": "graph_rl_reader"}
    assert edges["graph_base_reader"]["variant_of"] == "search_r1_rl"
    # Every edge points at a run the results database has.
    for entry in edges.values():
        assert {entry[k] for k in ("start_run", "variant_of", "ablation_of") if k in entry} <= set(edges)
    assert run_families(default)[:2] == ["search_r1", "rag_r1"] and "harr" in run_families(default)


# ---------------------------------------------------------------- HARR


def test_the_harr_runs_of_the_default_config(default):
    harr = default.pipeline("harr")
    assert list(harr.runs()) == ["harr_frozen", "harr_frozen_history", "harr", "harr_no_history"]
    assert harr.trained_runs() == ["harr", "harr_no_history"]
    assert default.trained_runs()[-2:] == ["harr", "harr_no_history"]
    assert harr.encoder_inputs("harr") == {"encoder": "results/harr/train/harr/work/final/state.json"}
    assert harr.encoder_inputs("harr_frozen") == {}
    assert harr.history_flag("harr_frozen_history") == "--history"
    assert harr.history_flag("harr_no_history") == "--no-history"
    generator = harr.generator()
    assert generator is default.runs[harr.generator_settings()["run"]]
    assert harr.world_inputs()["generator"] == default.run_model_inputs(generator.id)
    evals = harr.settings()["eval_datasets"]
    assert len(harr.eval_outputs()) == 4 * len(evals)
    assert lineage(default)["harr_no_history"] == {"family": "harr", "step": "rl", "start_run": "harr_frozen",
                                                   "ablation_of": "harr"}


def test_the_trainings_a_pipeline_reads_run_first(default):
    # HARR reads search_r1's SFT model: that recipe's SFT chain, and none of the other jobs, runs
    # at the pipeline chain's priority; rl keeps its own above the leaf jobs.
    chain = Workflow.CHAIN_PRIORITY
    assert default.pipeline("harr").gating_runs() == ["search_r1_sft"]
    assert default.train_priority("search_r1", "sft") == chain
    assert [default.train_priority(r, "sft") for r in ("rag_r1", "kg_r1", "knowrl")] == [0, 0, 0]
    assert default.train_priority("search_r1", "rl", 1) == 1
    # An RL generator gates its recipe's RL and the SFT start it trains from.
    rl_gen = Workflow(merged({"harr": {"generator": "rag_r1_rl"}}))
    assert rl_gen.train_priority("rag_r1", "rl", 1) == chain
    assert rl_gen.train_priority("rag_r1", "sft") == chain
    assert rl_gen.train_priority("search_r1", "sft") == 0
    # No pipeline reading a run, no raised priority.
    assert Workflow(merged({"harr": None})).train_priority("search_r1", "sft") == 0


def test_the_harr_paper_config_serves_an_outside_generator():
    wf = Workflow(merged(paper("harr")))
    generator = wf.pipeline("harr").generator()
    assert generator.stage == "outside" and generator.recipe == "harr.generator"
    assert wf.pipeline("harr").world_inputs()["generator"] == []
    assert wf.pipeline("harr").generator_arg([]) == generator.model
    assert wf.pipeline("harr").endpoint_args()[0] == "--generator-endpoint"
    assert wf.runs == {} and len(wf.pipeline("harr").manifests()) == 4


# ---------------------------------------------------------------- pipeline methods

QA_COUNT = REPO / "tests/plugins/qa_count.py"


def test_the_builtin_pipelines_are_enabled_by_their_config_key(default):
    assert list(default.pipelines) == ["harr", "construct_kg"]
    assert default.rule_files == ["rules/harr.smk", "rules/construct_kg.smk"]
    assert all((REPO / f).is_file() for f in default.rule_files)
    wf = Workflow(merged({"harr": None, "construct_kg": None}))
    assert wf.pipelines == {} and wf.rule_files == []
    # What the generic layers read of them comes from their plans.
    assert set(default.pipeline("harr").trained_runs()) <= set(default.trained_runs())
    assert default.pipeline("construct_kg").outputs()[-1] == "results/kg_built/rl/triples.parquet"
    assert set(default.pipeline("construct_kg").outputs()) <= set(default.all_outputs())


def test_a_pipeline_plugin_joins_the_workflow_from_config():
    wf = Workflow(merged({"pipelines": {"qa_count": {"plugin": str(QA_COUNT), "dataset": "world_test"}}}))
    assert list(wf.pipelines)[-1] == "qa_count"
    assert wf.rule_files[-1] == str(QA_COUNT.with_suffix(".smk"))
    assert "results/qa_count/world_test.json" in wf.all_outputs()
    assert "qa_count" not in Workflow(merged({"pipelines": {"qa_count": None}})).pipelines


@pytest.mark.parametrize("spec, needle", [
    ({"plugin": str(QA_COUNT), "dataset": "nope"}, "config key 'pipelines.qa_count.dataset': 'nope' is not a key"),
    ({"plugin": "tests/plugins/missing.py"}, "config key 'pipelines.qa_count.plugin': plugin 'tests/plugins/missing.py': no such file"),
    ({"plugin": str(REPO / "tests/plugins/direct_answer.py")}, "config key 'pipelines.qa_count.plugin'.* defines no PIPELINE"),
])
def test_a_pipeline_plugin_is_checked_before_the_dag(spec, needle):
    errors = validate(merged({"pipelines": {"qa_count": spec}}), SCHEMA)
    assert len(errors) == 1 and re.search(needle, errors[0]), errors


def test_a_pipeline_plugin_must_be_the_one_config_names():
    errors = validate(merged({"pipelines": {"other": {"plugin": str(QA_COUNT)}}}), SCHEMA)
    assert errors == [f"config key 'pipelines.other.plugin': '{QA_COUNT}' defines pipeline 'qa_count', not 'other'"]
    errors = validate(merged({"pipelines": {"harr": {"plugin": str(QA_COUNT)}}}), SCHEMA)
    assert errors == ["config key 'pipelines.harr': 'harr' is a built-in pipeline (top-level `harr:`)"]
