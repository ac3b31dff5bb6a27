"""The run table and the paths of every stage, computed from a validated config.

A `Workflow` is built once per config (rules/common.smk builds it after validation); its tables
are computed on first use and kept, since the config does not change while Snakemake plans.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from ragrl.methods import get_method
from ragrl.paths import hf_model_files, safe_name, world_files
from ragrl.recipe import parse_recipe
from ragrl.workflow.core import RESULTS, Run, recipe_json, recipe_part
from ragrl.workflow.pipelines import PipelinePlan, enabled_pipelines
from ragrl.workflow.resources import rule_resources


def method_of(settings: Mapping[str, Any]):
    """The method (ragrl.methods) a recipe's settings name."""
    return get_method(settings["env"], settings.get("plugin"))


class Workflow:
    """Everything the rules compute from config: paths, the runs and their definitions."""

    # Snakemake priority of the jobs on a pipeline's chain (its own long jobs and the trainings of
    # the runs it reads), above rule rl's 1: the longest chain of the default DAG, started late,
    # leaves one of 2 cores idle at the end (docs/BENCHMARKS.md, the timing table).
    CHAIN_PRIORITY = 2

    def __init__(self, config: dict):
        self.config = config
        # The enabled pipeline methods (ragrl.workflow.pipelines), by name; InputError for a plug-in
        # that cannot be loaded.
        enabled = enabled_pipelines(config)
        self.pipelines: dict[str, PipelinePlan] = {p.name: p.plan(self) for p in enabled}
        self.rule_files = [p.rules for p in enabled]

    def pipeline(self, name: str) -> PipelinePlan:
        """The plan of enabled pipeline `name` (its rule file reaches its own plan this way)."""
        return self.pipelines[name]

    def from_pipelines(self, answer: str) -> list:
        """The concatenation of every enabled pipeline's `answer` (a PipelinePlan method), in order."""
        return [x for plan in self.pipelines.values() for x in getattr(plan, answer)()]

    # ------------------------------------------------------------ the world and the base policy

    def world_dir(self) -> str:
        return f"{RESULTS}/world"

    def world_outputs(self) -> list[str]:
        return [f"{self.world_dir()}/{f}" for f in world_files()]

    def tiny_model_dir(self) -> str:
        return f"{RESULTS}/models/tiny"

    def pretrained_dir(self) -> str:
        return f"{RESULTS}/models/pretrained"

    def tiny_policy_dir(self) -> str:
        """The tiny policy recipes start from: pretrained to read (rule pretrain) unless pretrain.enabled is false."""
        return self.pretrained_dir() if self.config["pretrain"]["enabled"] else self.tiny_model_dir()

    def policy_dir(self) -> str:
        """The base policy: the locally built tiny model, or whatever config names."""
        policy = self.config["models"]["policy"]
        return self.tiny_policy_dir() if policy == "tiny" else policy

    def policy_inputs(self) -> list[str]:
        # A hub id or an external path is not a workflow output, so rules depend on it only by name.
        if self.config["models"]["policy"] == "tiny":
            return [f"{self.tiny_policy_dir()}/{f}" for f in hf_model_files()]
        return []

    def policy_param(self, policy_input) -> str:
        """The CLI's base policy: the built tiny policy's directory (an input), else its name."""
        return os.path.dirname(policy_input[0]) if policy_input else self.config["models"]["policy"]

    def model_param(self, model: str, model_input) -> str:
        """The CLI's model argument for a run's model: the base policy by policy_param, a merged
        checkpoint by its (input) directory."""
        return self.policy_param(model_input) if model == self.policy_dir() else model_input[0]

    # ------------------------------------------------------------ corpora, QA sets, retrieval

    def passages_path(self, corpus: str) -> str:
        return f"{RESULTS}/corpus/{corpus}/passages.parquet"

    def qa_path(self, dataset: str) -> str:
        """QA sets in the contract are used in place; the public formats go through rule qa."""
        spec = self.config["datasets"][dataset]
        return spec["path"] if spec["format"] == "parquet" else f"{RESULTS}/qa/{dataset}.parquet"

    def shard_paths(self, corpus: str) -> list[str]:
        n = self.config["retrieval"]["shards"]
        return [f"{RESULTS}/embeddings/{corpus}/shard-{i}-of-{n}.npy" for i in range(n)]

    def dense_index_dir(self, corpus: str, name: str) -> str:
        return f"{RESULTS}/index/{corpus}/{name}"

    def bm25_dir(self, corpus: str) -> str:
        return f"{RESULTS}/index/{corpus}/bm25"

    def retrievers(self) -> list[str]:
        """Retriever names: the dense indexes, then bm25 and hybrid when enabled."""
        retrieval = self.config["retrieval"]
        names = list(retrieval["indexes"])
        if retrieval["bm25"]:
            names.append("bm25")
        if retrieval["hybrid"]:
            names.append("hybrid")
        return names

    def retriever_files(self, corpus: str, name: str) -> dict[str, str]:
        """The index files one retriever reads (a dense dir's files, the BM25 dir, or both)."""
        indexes = self.config["retrieval"]["indexes"]
        dense = name if name in indexes else (next(iter(indexes), None) if name == "hybrid" else None)
        inputs = {}
        if dense is not None:
            inputs["index"] = f"{self.dense_index_dir(corpus, dense)}/meta.json"
        if name in ("bm25", "hybrid"):
            inputs["bm25"] = self.bm25_dir(corpus)
        return inputs

    def gpu_flag(self) -> list[str]:
        """`--gpu` for the dense-retrieval commands when retrieval.gpu is on (the FAISS index on the
        job's GPUs, the query encoder on CUDA; ragrl.retrieval.gpu)."""
        return ["--gpu"] if self.config["retrieval"]["gpu"] else []

    def retriever_flags(self, inputs: Mapping[str, Any], name: str) -> list[str]:
        """CLI flags selecting retriever `name` from its input files: --index DIR, --bm25 DIR, --mode."""
        args = []
        if "index" in inputs.keys():
            args += ["--index", os.path.dirname(inputs["index"])]
        if "bm25" in inputs.keys():
            args += ["--bm25", inputs["bm25"]]
        if args:
            args += ["--mode", {"bm25": "bm25", "hybrid": "hybrid"}.get(name, "dense")]
        args += self.gpu_flag() if "index" in inputs.keys() else []
        # A list: `{params.x:q}` quotes each element, so a path with a space stays one argument.
        return args

    def eval_datasets(self) -> list[str]:
        """The datasets retrieval recall is measured on."""
        return self.config["retrieval"]["eval"]["datasets"]

    def retrieval_reports(self) -> list[str]:
        corpus = self.config["retrieval"]["corpus"]
        return [f"{RESULTS}/retrieval/{corpus}/{r}.json" for r in self.retrievers()]

    # ------------------------------------------------------------ recipes

    def recipe(self, name: str) -> dict:
        return self.config["recipes"][name]

    def recipe_part(self, name: str, stage: str) -> dict:
        """What `stage` of recipe `name` reads (ragrl.workflow.recipe_part)."""
        return recipe_part(self.recipe(name), stage)

    def kg_spec(self, dataset: str) -> dict:
        """The KG (config kgs entry) a KG agent queries on `dataset`."""
        return self.config["kgs"][self.config["datasets"][dataset]["kg"]]

    def kg_inputs(self, dataset: str) -> dict[str, str]:
        # A world KG is a set of workflow outputs; an external one is a directory given by path.
        path = self.kg_spec(dataset)["path"].rstrip("/")
        if path.startswith(self.world_dir() + "/kg/"):
            return {"kg": f"{path}/triples.parquet", "kg_entities": f"{self.world_dir()}/entities.parquet"}
        if path.startswith(f"{RESULTS}/"):  # a KG a pipeline's rule builds: its triples are the output
            return {"kg": f"{path}/triples.parquet"}
        return {"kg": path}

    def env_inputs(self, settings: Mapping[str, Any], recipe_name: str, dataset: str) -> dict[str, str]:
        """What the recipe's environment reads, by its method's input kinds: the index files of its
        retriever, the dataset's KG."""
        inputs = {}
        method = method_of(settings)
        for kind in method.inputs:
            inputs.update(self.kg_inputs(dataset) if kind == "graph"
                          else self.retriever_files(self.config["retrieval"]["corpus"], settings["retriever"]))
        if method.files is not None:  # what the method's reward or metrics read (a KB)
            inputs.update(method.files(parse_recipe(settings, recipe_name)))
        return inputs

    def env_flags(self, inputs: Mapping[str, Any], settings: Mapping[str, Any], dataset: str,
                  kinds: tuple[str, ...] = ("graph", "retriever")) -> list[str]:
        """CLI flags naming what the environment reads (see env_inputs), as a list of arguments; only
        the input kinds in `kinds`."""
        flags = []
        for kind in (k for k in method_of(settings).inputs if k in kinds):
            if kind == "graph":
                kg = inputs["kg"]
                flags += ["--kg", os.path.dirname(kg) if kg.endswith(".parquet") else kg, "--kg-mode",
                          self.kg_spec(dataset)["mode"]]
            else:
                flags += self.retriever_flags(inputs, settings["retriever"])
        return flags

    def recipe_env_inputs(self, name: str) -> dict[str, str]:
        """Inputs of a recipe's training stages (its train dataset's KG for env kg)."""
        return self.env_inputs(self.recipe(name), name, self.recipe(name)["train_dataset"])

    def recipe_env_flags(self, name: str, inputs: Mapping[str, Any]) -> list[str]:
        return self.env_flags(inputs, self.recipe(name), self.recipe(name)["train_dataset"])

    def sft_import_inputs(self, name: str) -> dict[str, str]:
        """The published SFT file a recipe imports (sft.source: import) is an input of its sft_data job."""
        sft = self.recipe(name)["sft"]
        return {"sft_import": sft["import"]["path"]} if sft.get("source") == "import" else {}

    def sft_enabled(self, name: str) -> bool:
        return self.recipe(name)["sft"].get("enabled", True) and method_of(self.recipe(name)).sft_data

    def merged_dir(self, name: str, stage: str) -> str:
        return f"{RESULTS}/models/{name}/{stage}_merged"

    def sft_owner(self, name: str) -> str:
        """The recipe whose SFT model `name` starts RL from: its own, or `sft.from` (an ablation that
        shares another recipe's SFT start instead of training the same model again)."""
        return self.recipe(name)["sft"].get("from") or name

    def rl_start_model(self, name: str) -> str:
        """RL starts from the merged SFT model, or from the base policy when SFT is disabled."""
        return self.merged_dir(self.sft_owner(name), "sft") if self.sft_enabled(name) else self.policy_dir()

    def train_priority(self, name: str, stage: str, default: int = 0) -> int:
        """The Snakemake priority of recipe `name`'s `stage` ("sft": sft_data, sft, merge_sft; "rl":
        rl, merge_rl) jobs: CHAIN_PRIORITY when an enabled pipeline reads a model that stage
        trains or starts from (an RL run gates its SFT start too), else `default`."""
        return self.CHAIN_PRIORITY if (name, stage) in self._gating_stages else default

    @cached_property
    def _gating_stages(self) -> set[tuple[str, str]]:
        runs = [self.recipe_runs[r] for r in self.from_pipelines("gating_runs") if r in self.recipe_runs]
        return ({(self.sft_owner(run.recipe), "sft") for run in runs if run.stage in ("sft", "rl")}
                | {(run.recipe, "rl") for run in runs if run.stage == "rl"})

    # ------------------------------------------------------------ the run table

    @cached_property
    def recipe_runs(self) -> dict[str, Run]:
        """The runs of the recipes: baselines, SFT, RL, oracle."""
        config, policy = self.config, self.policy_dir()
        out = {}
        names = list(config["recipes"])
        # The baselines use the prompt and budgets of the first recipe whose method has them, on
        # evaluation.datasets: `base` in that recipe's environment, `no_retrieval` closed book.
        search = [n for n in names if method_of(self.recipe(n)).baselines]
        if config["evaluation"]["baselines"] and search:
            first = self.recipe(search[0])
            out["base"] = Run("base", search[0], first, policy, "base")
            # Closed book: the same prompt budgets, none of the method's own settings.
            closed = {**{k: v for k, v in first.items() if k not in ("options", "plugin")}, "env": "none"}
            out["no_retrieval"] = Run("no_retrieval", search[0], closed, policy, "no_retrieval")
        for name in names:
            settings, method = self.recipe(name), method_of(self.recipe(name))
            # A recipe sharing another's SFT start (sft.from) shares its untrained row too.
            if config["evaluation"]["baselines"] and method.own_baseline and self.sft_owner(name) == name:
                out[f"{name}_base"] = Run(f"{name}_base", name, settings, policy, "base", own_datasets=True)
            if self.sft_enabled(name) and self.sft_owner(name) == name:
                out[f"{name}_sft"] = Run(f"{name}_sft", name, settings, self.merged_dir(name, "sft"), "sft")
            out[f"{name}_rl"] = Run(f"{name}_rl", name, settings, self.merged_dir(name, "rl"), "rl")
            # The upper bound of a retrieving recipe: its RL policy with oracle retrieval (every query
            # gets its question's supporting passages).
            if config["evaluation"]["oracle"] and "retriever" in method.inputs and method.oracle_row:
                out[f"{name}_oracle"] = Run(f"{name}_oracle", name, settings, self.merged_dir(name, "rl"), "oracle")
        return out

    @cached_property
    def _pipeline_runs(self) -> dict[str, tuple[Run, PipelinePlan]]:
        return {r: (run, plan) for plan in self.pipelines.values() for r, run in plan.eval_runs(self.recipe_runs).items()}

    @cached_property
    def runs(self) -> dict[str, Run]:
        """Every evaluated run: the recipes' runs, then the pipelines' (a graph's reader runs)."""
        return {**self.recipe_runs, **{r: run for r, (run, _) in self._pipeline_runs.items()}}

    def run_owner(self, run_id: str) -> PipelinePlan | None:
        """The pipeline that added run `run_id`; None for a recipe's run."""
        owned = self._pipeline_runs.get(run_id)
        return owned[1] if owned else None

    def run_model_inputs(self, run_id: str) -> list[str]:
        # The base policy is a set of files (or nothing, for a hub id); merged models are directories.
        model = self.runs[run_id].model
        return self.policy_inputs() if model == self.policy_dir() else [model]

    def run_datasets(self, run_id: str) -> list[str]:
        """The datasets a run is evaluated on: its recipe's eval_datasets, else evaluation.datasets."""
        run = self.runs[run_id]
        if run.datasets:  # a pipeline's run names its own
            return list(run.datasets)
        if run.stage in ("base", "no_retrieval") and not run.own_datasets:
            return self.config["evaluation"]["datasets"]
        return run.settings.get("eval_datasets") or self.config["evaluation"]["datasets"]

    def run_inputs(self, run_id: str) -> dict[str, Any]:
        """A run's evaluation job reads its model, and per dataset the QA set and what the environment
        reads there (named <dataset>__<key>: each dataset may have its own KG)."""
        run = self.runs[run_id]
        inputs: dict[str, Any] = {"model": self.run_model_inputs(run_id)}
        for dataset in self.run_datasets(run_id):
            inputs[f"{dataset}__qa"] = self.qa_path(dataset)
            inputs.update({f"{dataset}__{k}": v for k, v in self.env_inputs(run.settings, run.recipe, dataset).items()})
        if run.stage == "oracle":
            inputs["passages"] = self.passages_path(self.config["retrieval"]["corpus"])
        owner = self.run_owner(run_id)
        if owner is not None:
            inputs.update(owner.run_inputs(run))
        return inputs

    def run_settings_json(self, run_id: str) -> str:
        run = self.runs[run_id]
        return recipe_json(recipe_part(run.settings, "eval"))

    def run_definition(self, run_id: str) -> dict:
        """Everything that defines a run (its manifest's config hash): the stages behind its model."""
        run, owner = self.runs[run_id], self.run_owner(run_id)
        if owner is not None:
            return owner.run_definition(run)
        parts = {"eval": recipe_part(run.settings, "eval")}
        if run.stage in ("sft", "rl", "oracle"):
            parts["sft_data"] = self.recipe_part(self.sft_owner(run.recipe), "sft_data")
            parts["sft"] = self.recipe_part(self.sft_owner(run.recipe), "sft")
        if run.stage in ("rl", "oracle"):
            parts["rl"] = self.recipe_part(run.recipe, "rl")
        return {"recipe": parts, "world": self.config["world"], "policy": self.config["models"]["policy"],
                "evaluation": {k: self.config["evaluation"][k] for k in ("max_questions",)}}

    def run_env_args(self, run_id: str, inputs: Mapping[str, Any]) -> list[str]:
        """`--dataset d --qa <qa> [--kg ...]` per dataset; the retriever's flags once (one index for all)."""
        run = self.runs[run_id]
        settings, datasets = run.settings, self.run_datasets(run_id)
        flags = []
        for dataset in datasets:
            env = {k: inputs[f"{dataset}__{k}"] for k in self.env_inputs(settings, run.recipe, dataset)}
            flags += ["--dataset", dataset, "--qa", inputs[f"{dataset}__qa"],
                      *self.env_flags(env, settings, dataset, ("graph",))]
        owner = self.run_owner(run_id)
        if owner is not None:  # the pipeline's flags answer every search, not the index
            return owner.run_args(run, inputs) + flags
        env = {k: inputs[f"{datasets[0]}__{k}"] for k in self.env_inputs(settings, run.recipe, datasets[0])}
        retriever = self.env_flags(env, settings, datasets[0], ("retriever",))
        if run.stage == "oracle":
            retriever += ["--oracle", "--passages", inputs["passages"]]
        return retriever + flags

    def trained_runs(self) -> list[str]:
        """Runs with a training log in the results database (named by run id)."""
        return [f"{r}_rl" for r in self.config["recipes"]] + self.from_pipelines("trained_runs")

    def pipeline_results(self) -> list[str]:
        """The pipelines' files the results database reads besides their manifests and logs."""
        return [f for plan in self.pipelines.values() for f in plan.evals() + plan.predictions()]

    # ------------------------------------------------------------ outputs

    def eval_outputs(self) -> list[str]:
        """One evaluation directory per run, <run>/<dataset>/{metrics.json,predictions.parquet} inside."""
        return [f"{RESULTS}/eval/{run}" for run in self.runs]

    def eval_files(self, name: str) -> list[str]:
        """The `name` file (metrics.json, predictions.parquet) of every evaluated (run, dataset)."""
        return [f"{RESULTS}/eval/{run}/{dataset}/{name}" for run in self.runs for dataset in self.run_datasets(run)]

    def run_manifests(self) -> list[str]:
        return [f"{RESULTS}/runs/{run}/run.json" for run in self.runs]

    def rule_gpus(self) -> dict[str, int]:
        """GPUs each rule requests (config resources), for GPU-hours in the jobs table."""
        names = set(self.config["resources"]["rules"]) | {"sft", "rl", "eval", "embed_shard", "index"}
        return {name: rule_resources(self.config, name)["gpu"] for name in sorted(names)}

    def tables(self) -> list[dict]:
        """The results tables: config's, then the pipelines' tables not named there (an overlay cannot
        append to a list)."""
        known = {t["name"] for t in self.config["results"]["tables"]}
        return self.config["results"]["tables"] + [t for t in self.from_pipelines("tables") if t["name"] not in known]

    def table_names(self) -> list[str]:
        return [t["name"] for t in self.tables()]

    def kb_outputs(self) -> list[str]:
        # rules/kb.smk: KnowRL-schema knowledge bases, only where config names some (kbs:).
        return [f"{RESULTS}/kb/{name}/knowledge_base.db" for name in self.config.get("kbs", {})]

    def all_outputs(self) -> list[str]:
        """The default target: every stage's final outputs."""
        config = self.config
        outputs = self.world_outputs() + self.kb_outputs()
        if config["recipes"]:  # no policy to check where none is trained (HARR's paper config)
            outputs.append(f"{RESULTS}/checks/policy_generate.txt")
        outputs += [self.passages_path(c) for c in config["corpora"]]
        outputs += [self.qa_path(d) for d in config["datasets"]]
        if self.eval_datasets():
            corpus, hybrid = config["retrieval"]["corpus"], self.retrievers()[-1]
            outputs += [f"{RESULTS}/tables/retrieval_recall.md",
                        f"{RESULTS}/checks/retrieval_service_{corpus}_{hybrid}.json"]
        outputs += self.eval_outputs() + self.run_manifests() + self.from_pipelines("outputs")
        # Results where there are runs to tabulate: the recipes' or a pipeline's own tables.
        if self.eval_outputs() or self.from_pipelines("tables"):
            outputs.append(f"{RESULTS}/ragrl.duckdb")
            outputs += [f"{RESULTS}/tables/{name}.md" for name in self.table_names()]
            outputs += [f"{RESULTS}/plots/metrics_{safe_name(m)}.png" for m in config["results"]["plot_metrics"]]
        return outputs
