# Shared helpers: config validation, path functions, per-rule resources.
# No workflow logic lives here; the stages are in src/ragrl.

import json
import os
import sys
from pathlib import Path

from snakemake.utils import validate

# The workflow imports a few standard-library-only helpers of its own package; putting src/ on the
# path lets `snakemake` run from any environment that has Snakemake, as conda-based clusters do.
# Jobs run `python -m ragrl ...` in whatever env they get (the venv here, a conda env on a
# cluster); PYTHONPATH makes that the workflow's own copy without installing it into each env.
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p))

from ragrl.config import config_errors, drop_null_entries  # noqa: E402
from ragrl.methods import get_method  # noqa: E402
from ragrl.models import ModelNameError, check_model_name  # noqa: E402
from ragrl.recipe import HARR_RUNS, harr_generator_spec, harr_lineage, parse_harr, parse_recipe  # noqa: E402
from ragrl.paths import DENSE_INDEX_FILES, hf_model_files, safe_name, world_files  # noqa: E402
from ragrl.retrieval.factory import factory_error  # noqa: E402


# An overlay drops a default's entry by setting it to null (`recipes: {rag_r1: null}`, `harr: null`);
# config/paper/*.yaml use this to drop the embedded default's toy corpora, datasets and recipes.
drop_null_entries(config)

_errors = config_errors(config, Path(workflow.basedir) / "config/schemas/config.schema.yaml")
if _errors:
    raise WorkflowError("invalid config:\n  " + "\n  ".join(_errors))
validate(config, schema="../config/schemas/config.schema.yaml", set_default=True)


def _check_models():
    # Fail before any job starts: a typo in a model name must not surface hours into a run.
    for key in ("policy", "embedding"):
        try:
            check_model_name(config["models"][key], key=f"models.{key}")
        except ModelNameError as exc:
            raise WorkflowError(str(exc)) from None


def _check_recipes():
    # Every key of every recipe section against the dataclass or method it feeds: a typo fails
    # `snakemake -n`, not a job hours into a run.
    errors = []
    for name, settings in config["recipes"].items():
        try:
            parse_recipe(settings, name)
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
            continue
        owner = (settings.get("sft") or {}).get("from")
        if owner is not None and (owner not in config["recipes"] or owner == name
                                  or (config["recipes"][owner].get("sft") or {}).get("from")
                                  or config["recipes"][owner].get("env") != settings.get("env")):
            errors.append(f"config key 'recipes.{name}.sft.from': {owner!r} must be another recipe of the same "
                          "env that trains its own SFT model")
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


def _check_sft_routes():
    # A route that cannot make SFT data from its dataset (gold plans on real questions) fails here,
    # saying what to set instead.
    errors = []
    for name, settings in config["recipes"].items():
        parsed = parse_recipe(settings, name)
        method, dataset = parsed.method, config["datasets"][settings["train_dataset"]]
        if not sft_enabled(name) or parsed.sft_source != "gold" or method.gold_sft_reason is None:
            continue
        why = method.gold_sft_reason(dataset)
        if why:
            errors.append(f"config key 'recipes.{name}.sft.source': gold (the default) cannot be used: {why}. "
                          "Set sft.source: teacher (with sft.teacher: {model}, served by the job, or "
                          "{base_url, model}), sft.source: import (with sft.import: {path, format}), "
                          "or sft.enabled: false")
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


def method_of(settings):
    return get_method(settings["env"], settings.get("plugin"))


def _check_references():
    # Names that point at other config entries: a dangling one must fail here, not as a
    # "missing input" deep in the DAG.
    errors = []
    retrieval = config["retrieval"]
    # The passage corpus matters only where something retrieves passages (KG agents do not).
    uses_passages = retrieval["eval"]["datasets"] or any("retriever" in method_of(r).inputs
                                                         for r in config["recipes"].values())
    if uses_passages and retrieval["corpus"] not in config["corpora"]:
        errors.append(f"config key 'retrieval.corpus': '{retrieval['corpus']}' is not a key of corpora {sorted(config['corpora'])}")
    for i, name in enumerate(retrieval["eval"]["datasets"]):
        if name not in config["datasets"]:
            errors.append(f"config key 'retrieval.eval.datasets[{i}]': '{name}' is not a key of datasets {sorted(config['datasets'])}")
    for name in retrieval["indexes"]:
        if name in ("bm25", "hybrid"):
            errors.append(f"config key 'retrieval.indexes.{name}': '{name}' is reserved for the sparse/hybrid retrievers")
    if retrieval["hybrid"] and not (retrieval["bm25"] and retrieval["indexes"]):
        errors.append("config key 'retrieval.hybrid': needs retrieval.bm25 and at least one dense index")
    errors += _mixed_input_errors()
    for name, spec in config["datasets"].items():
        if "kg" in spec and spec["kg"] not in config["kgs"]:
            errors.append(f"config key 'datasets.{name}.kg': '{spec['kg']}' is not a key of kgs {sorted(config['kgs'])}")
    for name, settings in config["recipes"].items():
        key = f"recipes.{name}"
        inputs = method_of(settings).inputs
        if "retriever" in inputs and settings.get("retriever") not in retrievers():
            errors.append(f"config key '{key}.retriever': '{settings.get('retriever')}' is not one of {retrievers()}")
        datasets = [("train_dataset", settings["train_dataset"])]
        datasets += [(f"eval_datasets[{i}]", d) for i, d in enumerate(settings.get("eval_datasets", []))]
        for field, dataset in datasets:
            if dataset not in config["datasets"]:
                errors.append(f"config key '{key}.{field}': '{dataset}' is not a key of datasets")
            elif "graph" in inputs and "kg" not in config["datasets"][dataset]:
                errors.append(f"config key '{key}.{field}': dataset '{dataset}' names no kg (datasets.{dataset}.kg), "
                              f"which method {settings['env']!r} needs")
    for i, name in enumerate(config["evaluation"]["datasets"]):
        if name not in config["datasets"]:
            errors.append(f"config key 'evaluation.datasets[{i}]': '{name}' is not a key of datasets {sorted(config['datasets'])}")
    errors += _construct_kg_errors()
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


def _mixed_input_errors():
    """A list of formats pairs with the files by position (a mixed corpus or QA set)."""
    errors = []
    for section, files in (("corpora", "inputs"), ("datasets", "path")):
        for name, spec in config[section].items():
            fmt, paths = spec["format"], spec[files]
            if isinstance(fmt, list) and not isinstance(paths, list):
                errors.append(f"config key '{section}.{name}.{files}': a list of formats needs a list of files, one each")
            elif isinstance(fmt, list) and len(fmt) != len(paths):
                errors.append(f"config key '{section}.{name}.format': {len(fmt)} formats for {len(paths)} "
                              f"{files} (one each, in order)")
            elif section == "datasets" and isinstance(paths, list) and "parquet" in ([fmt] if isinstance(fmt, str) else fmt):
                errors.append(f"config key 'datasets.{name}.format': a QA parquet is used in place and cannot be "
                              "mixed with other files; mix files in the public formats")
    return errors


def _construct_kg_errors():
    s = config.get("construct_kg") or {}
    if not s:
        return []
    errors = []
    if s["corpus"] not in config["corpora"]:
        errors.append(f"config key 'construct_kg.corpus': '{s['corpus']}' is not a key of corpora {sorted(config['corpora'])}")
    known = recipe_runs()
    for name, spec in s["constructors"].items():
        if isinstance(spec, dict) and spec["run"] not in known:
            errors.append(f"config key 'construct_kg.constructors.{name}.run': '{spec['run']}' is not an evaluated run {sorted(known)}")
    for name in set(s["constructors"]) & set(s.get("gold", {})):
        errors.append(f"config key 'construct_kg.gold.{name}': '{name}' is also a constructor")
    for i, name in enumerate(s.get("datasets", [])):
        if name not in config["datasets"]:
            errors.append(f"config key 'construct_kg.datasets[{i}]': '{name}' is not a key of datasets")
    reader = s.get("reader")
    if reader is not None:
        if reader not in known:
            errors.append(f"config key 'construct_kg.reader': '{reader}' is not an evaluated run {sorted(known)}")
        elif "retriever" not in method_of(known[reader]["settings"]).inputs:
            errors.append(f"config key 'construct_kg.reader': run '{reader}' does not search (its method reads no retriever)")
        if len(s.get("datasets", [])) > 1:
            errors.append("config key 'construct_kg.reader': reader runs answer one dataset; construct_kg.datasets names "
                          f"{len(s['datasets'])}")
    return errors


def _check_index_factories():
    # FAISS parses a factory string without data: a typo fails `snakemake -n`, not the index job
    # hours later with a bare swig RuntimeError.
    errors = [f"config key 'retrieval.indexes.{name}': {reason}"
              for name, factory in config["retrieval"]["indexes"].items()
              if (reason := factory_error(factory)) is not None]
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


RESULTS = "results"


wildcard_constraints:
    corpus="[A-Za-z0-9_]+",
    dataset="[A-Za-z0-9_]+",
    retriever="[A-Za-z0-9_]+",
    index="[A-Za-z0-9_]+",
    shard="[0-9]+",
    n="[0-9]+",


def world_dir():
    return f"{RESULTS}/world"


def world_outputs():
    return [f"{world_dir()}/{f}" for f in world_files()]


def tiny_model_dir():
    return f"{RESULTS}/models/tiny"


def pretrained_dir():
    return f"{RESULTS}/models/pretrained"


def tiny_policy_dir():
    """The tiny policy recipes start from: pretrained to read (rule pretrain) unless pretrain.enabled is false."""
    return pretrained_dir() if config["pretrain"]["enabled"] else tiny_model_dir()


def policy_dir():
    """The base policy: the locally built tiny model, or whatever config names."""
    policy = config["models"]["policy"]
    return tiny_policy_dir() if policy == "tiny" else policy


def policy_inputs():
    # A hub id or an external path is not a workflow output, so rules depend on it only by name.
    if config["models"]["policy"] == "tiny":
        return [f"{tiny_policy_dir()}/{f}" for f in hf_model_files()]
    return []


def output_dir(wildcards, output):
    """The directory of a rule's first output (a stage's --out), derived so it works without a shared FS."""
    return os.path.dirname(output[0])


def input_dir(wildcards, input):
    return os.path.dirname(input[0])


def policy_param(wildcards, input):
    # The built tiny policy is an input file; a hub id or an external path is passed by name.
    return os.path.dirname(input[0]) if input else config["models"]["policy"]


def policy_arg(wildcards, input):
    """--policy for rules that name the base policy among other inputs (as input.policy)."""
    return policy_param(wildcards, input.policy)


def rule_resources(rule_name):
    """Resources from config: the entry named after the rule, over the default entry."""
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    merged.setdefault("mem_mb", 2000)
    merged.setdefault("runtime", 30)
    merged.setdefault("gpu", 0)
    merged.pop("threads", None)
    if not merged["gpu"]:
        # A gpu_model set in `default` must not turn CPU rules into `--gpus=<model>:0` requests.
        merged.pop("gpu_model", None)
    merged["runtime"] = _growing_runtime(merged["runtime"], merged.pop("max_runtime", None))
    return merged


def _growing_runtime(minutes, cap=None):
    # A job killed at its time limit is retried (profile `retries`) with twice the time each
    # attempt: 30 → 60 → 120 minutes, so a too-tight runtime in config costs a retry, not the run.
    # The cap keeps a retry within the partition's MaxTime: beyond it sbatch refuses the job, while
    # a retry at the cap still helps a job that resumes from checkpoints (RL).
    def runtime(wildcards, attempt):
        grown = minutes * 2 ** (attempt - 1)
        return grown if cap is None else max(minutes, min(grown, cap))

    return runtime


def rule_threads(rule_name):
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    return merged.get("threads", 1)


# ---------------------------------------------------------------- corpora, QA sets, retrieval


def corpus_inputs(wildcards):
    return config["corpora"][wildcards.corpus]["inputs"]


def passages_path(corpus):
    return f"{RESULTS}/corpus/{corpus}/passages.parquet"


def qa_path(dataset):
    """QA sets in the contract are used in place; the public formats go through rule qa."""
    spec = config["datasets"][dataset]
    return spec["path"] if spec["format"] == "parquet" else f"{RESULTS}/qa/{dataset}.parquet"


def qa_source(wildcards):
    return config["datasets"][wildcards.dataset]["path"]


def shard_paths(corpus):
    n = config["retrieval"]["shards"]
    return [f"{RESULTS}/embeddings/{corpus}/shard-{i}-of-{n}.npy" for i in range(n)]


def dense_index_dir(corpus, name):
    return f"{RESULTS}/index/{corpus}/{name}"


def bm25_dir(corpus):
    return f"{RESULTS}/index/{corpus}/bm25"


def retrievers():
    """Retriever names: the dense indexes, then bm25 and hybrid when enabled."""
    names = list(config["retrieval"]["indexes"])
    if config["retrieval"]["bm25"]:
        names.append("bm25")
    if config["retrieval"]["hybrid"]:
        names.append("hybrid")
    return names


def retriever_inputs(wildcards):
    """The index files one retriever reads (a dense dir's files, the BM25 dir, or both)."""
    return retriever_files(wildcards.corpus, wildcards.retriever)


def retriever_files(corpus, name):
    first_dense = next(iter(config["retrieval"]["indexes"]), None)
    dense = name if name in config["retrieval"]["indexes"] else (first_dense if name == "hybrid" else None)
    inputs = {}
    if dense is not None:
        inputs["index"] = f"{dense_index_dir(corpus, dense)}/meta.json"
    if name in ("bm25", "hybrid"):
        inputs["bm25"] = bm25_dir(corpus)
    return inputs


def gpu_flag():
    """`--gpu` for the dense-retrieval commands when retrieval.gpu is on (the FAISS index on the
    job's GPUs, the query encoder on CUDA; ragrl.retrieval.gpu)."""
    return ["--gpu"] if config["retrieval"]["gpu"] else []


def retriever_args(wildcards, input):
    """CLI flags selecting that retriever: --index DIR, --bm25 DIR, --mode."""
    return _retriever_flags(input, wildcards.retriever)


def _retriever_flags(input, name):
    args = []
    if "index" in input.keys():
        args += ["--index", os.path.dirname(input["index"])]
    if "bm25" in input.keys():
        args += ["--bm25", input["bm25"]]
    if args:
        args += ["--mode", {"bm25": "bm25", "hybrid": "hybrid"}.get(name, "dense")]
    args += gpu_flag() if "index" in input.keys() else []
    # A list: `{params.x:q}` quotes each element, so a path with a space stays one argument.
    return args


def eval_datasets():
    return config["retrieval"]["eval"]["datasets"]


def retrieval_reports():
    corpus = config["retrieval"]["corpus"]
    return [f"{RESULTS}/retrieval/{corpus}/{r}.json" for r in retrievers()]


# ---------------------------------------------------------------- recipes, runs, evaluation


def recipe(name):
    return config["recipes"][name]


def recipe_json(settings):
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


# What each stage of a recipe reads. Rules get only their part as params, so that editing one
# setting re-runs exactly the jobs it affects (Snakemake re-runs a job when its params change):
# a new RL learning rate re-runs that recipe's RL and what follows, not its SFT.
_ROLLOUT_KEYS = ("env", "plugin", "retriever", "topk", "max_queries", "rollout", "seed", "options")
# How the SFT data are made (ragrl.recipe.SFT_EXTRA_KEYS minus `enabled`, which only gates the rules).
_SFT_DATA_KEYS = ("limit", "source", "teacher", "import")


def recipe_part(name, stage, settings=None):
    settings = recipe(name) if settings is None else settings
    if stage == "sft_data":
        return {**{k: settings[k] for k in _ROLLOUT_KEYS if k in settings},
                "sft": {k: settings["sft"].get(k) for k in _SFT_DATA_KEYS if k in settings["sft"] or k == "limit"}}
    if stage == "sft":
        return {"sft": settings["sft"], "seed": settings.get("seed", 0)}
    if stage == "rl":
        return {k: v for k, v in settings.items() if k not in ("sft", "eval_datasets")}
    if stage == "eval":
        return {k: settings[k] for k in _ROLLOUT_KEYS if k in settings}
    raise ValueError(stage)


def kg_spec(dataset):
    """The KG (config kgs entry) a KG agent queries on `dataset`."""
    return config["kgs"][config["datasets"][dataset]["kg"]]


def kg_inputs(dataset):
    # A world KG is a set of workflow outputs; an external one is a directory given by path.
    path = kg_spec(dataset)["path"].rstrip("/")
    if path.startswith(world_dir() + "/kg/"):
        return {"kg": f"{path}/triples.parquet", "kg_entities": f"{world_dir()}/entities.parquet"}
    if path.startswith(f"{RESULTS}/kg_built/"):  # a KG a constructor builds (rule construct_kg)
        return {"kg": f"{path}/triples.parquet"}
    return {"kg": path}


def env_inputs(settings, recipe_name, dataset):
    """What the recipe's environment reads, by its method's input kinds: the index files of its
    retriever, the dataset's KG."""
    inputs = {}
    method = method_of(settings)
    for kind in method.inputs:
        inputs.update(kg_inputs(dataset) if kind == "graph" else retriever_files(config["retrieval"]["corpus"],
                                                                              settings["retriever"]))
    if method.files is not None:  # what the method's reward or metrics read (a KB)
        inputs.update(method.files(parse_recipe(settings, recipe_name)))
    return inputs


def env_flags(input, settings, dataset, kinds=("graph", "retriever")):
    """CLI flags naming what the environment reads (see env_inputs), as a list of arguments; only
    the input kinds in `kinds`."""
    flags = []
    for kind in (k for k in method_of(settings).inputs if k in kinds):
        if kind == "graph":
            kg = input["kg"]
            flags += ["--kg", os.path.dirname(kg) if kg.endswith(".parquet") else kg, "--kg-mode",
                      kg_spec(dataset)["mode"]]
        else:
            flags += _retriever_flags(input, settings["retriever"])
    return flags


def recipe_env_inputs(name):
    """Inputs of a recipe's training stages (its train dataset's KG for env kg)."""
    return env_inputs(recipe(name), name, recipe(name)["train_dataset"])


def recipe_env_flags(wildcards, input):
    return env_flags(input, recipe(wildcards.recipe), recipe(wildcards.recipe)["train_dataset"])


def sft_import_inputs(name):
    """The published SFT file a recipe imports (sft.source: import) is an input of its sft_data job."""
    sft = recipe(name)["sft"]
    return {"sft_import": sft["import"]["path"]} if sft.get("source") == "import" else {}


def sft_enabled(name):
    return recipe(name)["sft"].get("enabled", True) and method_of(recipe(name)).sft_data


def merged_dir(name, stage):
    return f"{RESULTS}/models/{name}/{stage}_merged"


def sft_owner(name):
    """The recipe whose SFT model `name` starts RL from: its own, or `sft.from` (an ablation that
    shares another recipe's SFT start instead of training the same model again)."""
    return recipe(name)["sft"].get("from") or name


def rl_start_model(name):
    """RL starts from the merged SFT model, or from the base policy when SFT is disabled."""
    return merged_dir(sft_owner(name), "sft") if sft_enabled(name) else policy_dir()


def runs():
    """Every evaluated run: id → recipe settings (as passed to the CLI), model dir, stage."""
    out = recipe_runs()
    out.update(graph_reader_runs(out))
    return out


def recipe_runs():
    """The runs of the recipes: baselines, SFT, RL, oracle."""
    out = {}
    names = list(config["recipes"])
    # The baselines use the prompt and budgets of the first recipe whose method has them, on
    # evaluation.datasets: `base` in that recipe's environment, `no_retrieval` closed book.
    search = [n for n in names if method_of(recipe(n)).baselines]
    if config["evaluation"]["baselines"] and search:
        first = recipe(search[0])
        out["base"] = {"recipe": search[0], "settings": first, "model": policy_dir(), "stage": "base"}
        # Closed book: the same prompt budgets, none of the method's own settings.
        closed = {**{k: v for k, v in first.items() if k not in ("options", "plugin")}, "env": "none"}
        out["no_retrieval"] = {"recipe": search[0], "settings": closed, "model": policy_dir(),
                               "stage": "no_retrieval"}
    for name in names:
        # A recipe sharing another's SFT start (sft.from) shares its untrained row too.
        if config["evaluation"]["baselines"] and method_of(recipe(name)).own_baseline and sft_owner(name) == name:
            out[f"{name}_base"] = {"recipe": name, "settings": recipe(name), "model": policy_dir(), "stage": "base",
                                   "own_datasets": True}
        if sft_enabled(name) and sft_owner(name) == name:
            out[f"{name}_sft"] = {"recipe": name, "settings": recipe(name), "model": merged_dir(name, "sft"),
                                  "stage": "sft"}
        out[f"{name}_rl"] = {"recipe": name, "settings": recipe(name), "model": merged_dir(name, "rl"), "stage": "rl"}
        # The upper bound of a retrieving recipe: its RL policy with oracle retrieval (every query
        # gets its question's supporting passages).
        if config["evaluation"]["oracle"] and "retriever" in method_of(recipe(name)).inputs \
                and method_of(recipe(name)).oracle_row:
            out[f"{name}_oracle"] = {"recipe": name, "settings": recipe(name), "model": merged_dir(name, "rl"),
                                     "stage": "oracle"}
    return out


def run_model_inputs(run_id):
    # The base policy is a set of files (or nothing, for a hub id); merged models are directories.
    model = runs()[run_id]["model"]
    if model == policy_dir():
        return policy_inputs()
    return [model]


def run_datasets(run_id):
    """The datasets a run is evaluated on: its recipe's eval_datasets, else evaluation.datasets."""
    run = runs()[run_id]
    if run["stage"] == "graph":
        return run["datasets"]
    if run["stage"] in ("base", "no_retrieval") and not run.get("own_datasets"):
        return config["evaluation"]["datasets"]
    return run["settings"].get("eval_datasets") or config["evaluation"]["datasets"]


def run_inputs(wildcards):
    """A run's evaluation job reads its model, and per dataset the QA set and what the environment
    reads there (named <dataset>__<key>: each dataset may have its own KG)."""
    run = runs()[wildcards.run]
    inputs = {"model": run_model_inputs(wildcards.run)}
    for dataset in run_datasets(wildcards.run):
        inputs[f"{dataset}__qa"] = qa_path(dataset)
        inputs.update({f"{dataset}__{k}": v for k, v in env_inputs(run["settings"], run["recipe"], dataset).items()})
    if run["stage"] in ("oracle", "graph"):
        inputs["passages"] = passages_path(config["retrieval"]["corpus"])
    if run["stage"] == "graph":  # one dataset (checked): its ranking over the run's graph
        inputs["ranking"] = f"{RESULTS}/graph_rag/graph_{run['graph']}/{run['datasets'][0]}/ranking.parquet"
    return inputs


def run_settings_json(wildcards):
    run = runs()[wildcards.run]
    return recipe_json(recipe_part(run["recipe"], "eval", run["settings"]))


def run_definition(run_id):
    """Everything that defines a run (its manifest's config hash): the stages behind its model."""
    run = runs()[run_id]
    if run["stage"] == "graph":  # the reader's own definition, and the graph its passages come from
        return {**run_definition(run["reader"]), "graph": {run["graph"]: constructor_definition(run["graph"])}}
    parts = {"eval": recipe_part(run["recipe"], "eval", run["settings"])}
    if run["stage"] in ("sft", "rl", "oracle"):
        parts["sft_data"] = recipe_part(sft_owner(run["recipe"]), "sft_data")
        parts["sft"] = recipe_part(sft_owner(run["recipe"]), "sft")
    if run["stage"] in ("rl", "oracle"):
        parts["rl"] = recipe_part(run["recipe"], "rl")
    return {"recipe": parts, "world": config["world"], "policy": config["models"]["policy"],
            "evaluation": {k: config["evaluation"][k] for k in ("max_questions",)}}


def run_env_args(wildcards, input):
    """`--dataset d --qa <qa> [--kg ...]` per dataset; the retriever's flags once (one index for all)."""
    run = runs()[wildcards.run]
    settings, datasets = run["settings"], run_datasets(wildcards.run)
    flags = []
    for dataset in datasets:
        env = {k: input[f"{dataset}__{k}"] for k in env_inputs(settings, run["recipe"], dataset)}
        flags += ["--dataset", dataset, "--qa", input[f"{dataset}__qa"], *env_flags(env, settings, dataset, ("graph",))]
    if run["stage"] == "graph":  # every search answered from the graph's ranking, not the index
        return ["--ranking", input["ranking"], "--passages", input["passages"]] + flags
    env = {k: input[f"{datasets[0]}__{k}"] for k in env_inputs(settings, run["recipe"], datasets[0])}
    retriever = env_flags(env, settings, datasets[0], ("retriever",))
    if run["stage"] == "oracle":
        retriever += ["--oracle", "--passages", input["passages"]]
    return retriever + flags


def run_model_arg(wildcards, input):
    return model_param(runs()[wildcards.run]["model"], wildcards, input.model)


def model_param(model, wildcards, model_input):
    """The CLI's model argument for a run's model: the base policy by policy_param, a merged
    checkpoint by its (input) directory."""
    return policy_param(wildcards, model_input) if model == policy_dir() else model_input[0]


def eval_outputs():
    """One evaluation directory per run, <run>/<dataset>/{metrics.json,predictions.parquet} inside."""
    return [f"{RESULTS}/eval/{run}" for run in runs()]


def eval_files(name):
    """The `name` file (metrics.json, predictions.parquet) of every evaluated (run, dataset)."""
    return [f"{RESULTS}/eval/{run}/{dataset}/{name}" for run in runs() for dataset in run_datasets(run)]


def run_manifests():
    return [f"{RESULTS}/runs/{run}/run.json" for run in runs()]


def rule_gpus():
    """GPUs each rule requests (config resources), for GPU-hours in the jobs table."""
    names = set(config["resources"]["rules"]) | {"sft", "rl", "eval", "embed_shard", "index"}
    return {name: rule_resources(name)["gpu"] for name in sorted(names)}


def table_names():
    return [t["name"] for t in config["results"]["tables"]]


def kb_outputs():
    # rules/kb.smk: KnowRL-schema knowledge bases, only where config names some (kbs:).
    return [f"{RESULTS}/kb/{name}/knowledge_base.db" for name in config.get("kbs", {})]


def all_outputs():
    outputs = world_outputs() + kb_outputs()
    if config["recipes"]:  # no policy to check where none is trained (HARR's paper config)
        outputs.append(f"{RESULTS}/checks/policy_generate.txt")
    outputs += [passages_path(c) for c in config["corpora"]]
    outputs += [qa_path(d) for d in config["datasets"]]
    if eval_datasets():
        corpus, hybrid = config["retrieval"]["corpus"], retrievers()[-1]
        outputs += [f"{RESULTS}/tables/retrieval_recall.md",
                    f"{RESULTS}/checks/retrieval_service_{corpus}_{hybrid}.json"]
    outputs += eval_outputs() + run_manifests() + harr_eval_outputs() + harr_recall_outputs()
    outputs += graph_rank_outputs() + graph_manifests()
    if eval_outputs() or harr_eval_outputs():
        outputs.append(f"{RESULTS}/ragrl.duckdb")
        outputs += [f"{RESULTS}/tables/{name}.md" for name in table_names()]
        outputs += [f"{RESULTS}/plots/metrics_{safe_name(m)}.png" for m in config["results"]["plot_metrics"]]
    return outputs


# ---------------------------------------------------------------- results (rules/results.smk)

def run_lineage():
    """Every run of the results database → its family, step and the runs a reader compares it with
    (ragrl.results.paired): start_run (what its model was trained from), variant_of (the same
    policy or constructor with one thing changed: oracle or no retrieval, a graph's ranking, the
    gold graph), ablation_of (a recipe sharing another's SFT start, sft.from, against that
    recipe's RL run). All of it follows from the recipes and the runs() table, as the DAG does."""
    recipe_map = recipe_runs()

    def run_of(name, stage):
        return next((r for r, run in recipe_map.items() if run["recipe"] == name and run["stage"] == stage), None)

    def base_of(name):
        # The untrained policy on the recipe's own task, else the shared base row.
        shared = next((r for r, run in recipe_map.items() if run["stage"] == "base" and not run.get("own_datasets")), None)
        return run_of(name, "base") or shared

    out = {}
    for run_id, run in recipe_map.items():
        name, stage = run["recipe"], run["stage"]
        owner = sft_owner(name)
        entry = {"family": owner, "step": stage}
        if stage == "sft":
            entry["start_run"] = base_of(name)
        elif stage == "rl":
            entry["start_run"] = run_of(owner, "sft") if sft_enabled(name) else base_of(owner)
            if owner != name:
                entry["ablation_of"] = run_of(owner, "rl")
        elif stage != "base":  # oracle, no_retrieval: the model of a trained (or base) run, evaluated otherwise
            entry["variant_of"] = next((r for r, o in recipe_map.items() if o["model"] == run["model"]
                                        and o["recipe"] == name and o["stage"] in ("base", "sft", "rl")), None)
        out[run_id] = entry
    out.update(_graph_lineage(out))
    out.update(_harr_lineage())
    return {r: {k: v for k, v in entry.items() if v is not None} for r, entry in out.items()}


def _graph_lineage(recipe_lineage):
    """The corpus-level graphs (graph_<g>) and their reader runs (graph_<g>_reader): a graph built
    by a run takes that run's step and starts from the graph its start run built; a gold graph is
    the variant of the graph an RL constructor built; a reader run varies the reader's own run."""
    s = construct_kg_settings()
    gold = s.get("gold", {})
    recipe_map = recipe_runs()
    built = {g: spec["run"] for g, spec in s.get("constructors", {}).items() if isinstance(spec, dict)}
    # The model behind each constructor: a run's, or the base policy's ("policy").
    models = {g: recipe_map[r]["model"] for g, r in built.items()}
    models.update({g: policy_dir() for g, spec in s.get("constructors", {}).items() if spec == "policy"})

    def graph_step(g):
        if g in gold:
            return "gold"
        if g in built:
            return recipe_lineage[built[g]]["step"]
        return "base" if g in models else "model"

    def built_by(run):
        # The graph the model of `run` built (the base policy's, for a base run).
        return next((g for g, m in models.items() if run and m == recipe_map[run]["model"]), None)

    final = next((g for g, r in built.items() if recipe_lineage[r]["step"] == "rl"), None)

    def links(g):
        if g in gold:
            return {"variant_of": final}
        return {"start_run": built_by(recipe_lineage[built[g]].get("start_run"))} if g in built else {}

    out = {}
    for g in graph_names() if graph_manifests() else []:
        out[f"graph_{g}"] = {"family": "construct_kg", "step": graph_step(g),
                             **{k: f"graph_{v}" for k, v in links(g).items() if v}}
    readers = graph_reader_runs(recipe_runs())
    for g in graph_names() if readers else []:
        entry = {"family": "construct_kg", "step": f"{graph_step(g)} graph",
                 **{k: f"graph_{v}_reader" for k, v in links(g).items() if v}}
        entry.setdefault("variant_of", s["reader"])
        out[f"graph_{g}_reader"] = entry
    return out


def _harr_lineage():
    # ragrl.recipe.harr_lineage: from HARR_RUNS' flags, none without `harr`.
    return harr_lineage(harr_runs())


def trained_runs():
    """Runs with a training log in the results database (named by run id)."""
    return [f"{r}_rl" for r in config["recipes"]] + harr_trained_runs()


def run_families():
    return list(dict.fromkeys(entry["family"] for entry in run_lineage().values()))


# ---------------------------------------------------------------- construct_kg (rules/construct_kg.smk)


def construct_kg_settings():
    return config.get("construct_kg") or {}


def construct_kg_outputs():
    return [f"{RESULTS}/kg_built/{name}/triples.parquet" for name in construct_kg_settings().get("constructors", {})]


def constructor_spec(wildcards):
    constructors = construct_kg_settings().get("constructors", {})
    if wildcards.constructor not in constructors:
        raise WorkflowError(f"construct_kg.constructors has no {wildcards.constructor!r}; it names {sorted(constructors)}")
    return constructors[wildcards.constructor]


def constructor_inputs(wildcards):
    # "policy": the base policy (the built tiny model is a workflow output); {run: id}: that run's
    # checkpoint (a workflow output); else a path or hub id.
    spec = constructor_spec(wildcards)
    if isinstance(spec, dict):
        model = run_model_inputs(spec["run"])
    else:
        model = policy_inputs() if spec == "policy" else []
    return {"passages": passages_path(construct_kg_settings()["corpus"]), "model": model}


def constructor_model(wildcards, input):
    spec = constructor_spec(wildcards)
    if isinstance(spec, dict):
        return model_param(runs()[spec["run"]]["model"], wildcards, input.model)
    return policy_param(wildcards, input.model) if spec == "policy" else spec


def constructor_definition(graph):
    """What defines a graph: a gold KG's path, or its constructor (a run's definition or a model)."""
    s = construct_kg_settings()
    if graph in s.get("gold", {}):
        return {"gold": s["gold"][graph]}
    spec = s["constructors"][graph]
    settings = {k: s.get(k) for k in ("corpus", "batch_size", "max_turn_tokens", "limit")}
    if isinstance(spec, dict):
        return {"run": run_definition(spec["run"]), **settings}
    return {"model": config["models"]["policy"] if spec == "policy" else spec, **settings}


def graph_names():
    """Graphs the benchmark ranks passages over: each constructor's KG, then the gold KGs."""
    s = construct_kg_settings()
    return list(s.get("constructors", {})) + list(s.get("gold", {}))


def graph_triples(graph):
    gold = construct_kg_settings().get("gold", {})
    return f"{gold[graph].rstrip('/')}/triples.parquet" if graph in gold else f"{RESULTS}/kg_built/{graph}/triples.parquet"


def graph_rank_outputs():
    datasets = construct_kg_settings().get("datasets", [])
    return [f"{RESULTS}/graph_rag/graph_{g}/{d}/metrics.json" for g in graph_names() for d in datasets]


def graph_manifests():
    return [f"{RESULTS}/graph_rag/runs/graph_{g}/run.json" for g in graph_names()] if construct_kg_settings().get(
        "datasets") else []


def graph_reader_runs(recipe_run_map):
    """Reader runs: the reader run's policy and settings, every search answered by a graph's PPR
    ranking of the question's passages (stage "graph")."""
    s = construct_kg_settings()
    if not s.get("reader") or not s.get("datasets"):
        return {}
    reader = recipe_run_map[s["reader"]]
    return {f"graph_{g}_reader": {**reader, "stage": "graph", "graph": g, "reader": s["reader"],
                                  "datasets": s["datasets"]} for g in graph_names()}


# ---------------------------------------------------------------- HARR (rules/harr.smk)
# Jobs exist when config names `harr` (the default does; `harr: null` drops them): filter ->
# train (HARR, and the no-history ablation) -> evaluation of the frozen generator with the
# frozen / HARR / no-history encoder -> the encoders' recall@k on multi-hop questions -> tables.


def harr_settings():
    return config.get("harr") or None


def harr():
    """config `harr`, parsed (every key checked against its dataclass)."""
    return parse_harr(harr_settings())


def harr_runs():
    """Evaluated HARR run ids -> (trained encoder?, history-aware states?); none without `harr`."""
    return dict(HARR_RUNS) if harr_settings() else {}


def harr_trained_runs():
    return [r for r, (trained, _) in harr_runs().items() if trained]


def harr_json():
    return recipe_json(harr().to_config())


def harr_generator_settings():
    """harr.generator as a mapping (ragrl.recipe.harr_generator_spec): {run} or {model, recipe},
    with its endpoint settings."""
    return harr_generator_spec(harr_settings()["generator"])


def harr_generator():
    """The frozen generator as a run entry (recipe, settings, model): a run of this workflow, or
    an outside checkpoint with the recipe settings config gives it."""
    spec = harr_generator_settings()
    if "run" in spec:
        return runs()[spec["run"]]
    return {"recipe": "harr.generator", "settings": spec["recipe"], "model": spec["model"], "stage": "outside"}


def harr_generator_definition():
    spec = harr_generator_settings()
    if "run" in spec:
        return run_definition(spec["run"])
    return {"model": spec["model"], "recipe": {"eval": recipe_part(None, "eval", spec["recipe"])}}


def harr_endpoint_args(wildcards):
    """--generator-endpoint for a served generator (external base_url, or `serve`: a vLLM server
    the job starts and stops); nothing when it is loaded in process."""
    spec = harr_generator_settings()
    endpoint = {k: spec[k] for k in ("base_url", "served_name", "serve") if k in spec}
    return ["--generator-endpoint", recipe_json(endpoint)] if endpoint else []


def harr_generator_json():
    gen = harr_generator()
    return recipe_json(recipe_part(gen["recipe"], "eval", gen["settings"]))


def harr_world_inputs():
    """The generator's checkpoint, the dense index the encoder searches and its passages."""
    corpus = config["retrieval"]["corpus"]
    spec = harr_generator_settings()
    # An outside checkpoint (hub id or path) is not a workflow output: passed by name.
    return {"generator": run_model_inputs(spec["run"]) if "run" in spec else [],
            "index": f"{dense_index_dir(corpus, harr_settings()['index'])}/meta.json",
            "passages": passages_path(corpus)}


def harr_generator_arg(wildcards, input):
    model = harr_generator()["model"]
    if model == policy_dir():
        return policy_param(wildcards, input.generator)
    return input.generator[0] if input.generator else model


def harr_history_flag(run):
    return "--history" if harr_runs()[run][1] else "--no-history"


def harr_encoder_inputs(wildcards):
    # The trained runs read their merged encoder; the frozen run the index's own encoder.
    return {"encoder": f"{RESULTS}/harr/train/{wildcards.run}/work/final/state.json"} if harr_runs()[wildcards.run][0] else {}


def harr_encoder_args(wildcards, input):
    return ["--encoder", os.path.join(os.path.dirname(input.encoder), "encoder")] if "encoder" in input.keys() else []


def harr_eval_outputs():
    if not harr_settings():
        return []
    return [f"{RESULTS}/harr/eval/{run}/{d}/metrics.json" for run in harr_runs() for d in harr_settings()["eval_datasets"]]


def harr_predictions():
    return [p.replace("metrics.json", "predictions.parquet") for p in harr_eval_outputs()]


def harr_recall_outputs():
    if not harr_settings() or not harr().recall_k:
        return []
    return [f"{RESULTS}/harr/recall/{run}/{d}/metrics.json" for run in harr_runs() for d in harr_settings()["eval_datasets"]]


def harr_manifests():
    return [f"{RESULTS}/harr/runs/{run}/run.json" for run in harr_runs()]


def harr_train_logs():
    # Named by run id: the results database files a training log under its directory's name.
    return [f"{RESULTS}/harr/train/{run}/train_log.jsonl" for run in harr_trained_runs()]


def harr_tables():
    """Tables harr_em / harr_f1 (frozen vs HARR vs no-history, 95% intervals) and harr_recall /
    harr_all (the encoders' recall@k and all@k on the multi-hop questions, k = environment.topk)."""
    if not harr_settings():
        return []
    parsed = harr()
    rows, evals = list(harr_runs()), list(parsed.eval_datasets)
    answers = [
        {"name": "harr_em", "title": "HARR: the frozen generator with each query encoder (exact match)", "metric": "em",
         "runs": rows, "datasets": evals},
        {"name": "harr_f1", "title": "HARR: the frozen generator with each query encoder (F1)", "metric": "f1",
         "runs": rows, "datasets": evals},
    ]
    if not parsed.recall_k:
        return answers
    k = parsed.environment.topk if parsed.environment.topk in parsed.recall_k else max(parsed.recall_k)
    multihop = [f"{d}_multihop" for d in evals]
    return answers + [
        {"name": "harr_recall", "title": f"HARR: query encoders' recall@{k} on multi-hop questions",
         "metric": f"recall@{k}", "runs": rows, "datasets": multihop},
        {"name": "harr_all", "title": f"HARR: query encoders' all@{k} (every supporting passage) on multi-hop questions",
         "metric": f"all@{k}", "runs": rows, "datasets": multihop},
    ]


def _check_harr():
    if not harr_settings():
        return
    try:
        parsed = harr()
    except (ValueError, TypeError) as exc:
        raise WorkflowError(f"invalid config:\n  {exc}") from None
    errors = []
    run = harr_generator_settings().get("run")
    if run is not None and run not in runs():
        errors.append(f"config key 'harr.generator': '{run}' is not an evaluated run {sorted(runs())}")
    elif "retriever" not in method_of(harr_generator()["settings"]).inputs:
        what = f"run '{run}'" if run else "its recipe"
        errors.append(f"config key 'harr.generator': {what} does not search (its method reads no retriever)")
    if parsed.index not in config["retrieval"]["indexes"]:
        errors.append(f"config key 'harr.index': '{parsed.index}' is not a dense index of retrieval.indexes "
                      f"{sorted(config['retrieval']['indexes'])}")
    for field, name in [("train_dataset", parsed.train_dataset)] + [(f"eval_datasets[{i}]", d)
                                                                   for i, d in enumerate(parsed.eval_datasets)]:
        if name not in config["datasets"]:
            errors.append(f"config key 'harr.{field}': '{name}' is not a key of datasets")
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))
    # The harr_* tables join the configured ones (an overlay cannot append to a list).
    known = {t["name"] for t in config["results"]["tables"]}
    config["results"]["tables"] += [t for t in harr_tables() if t["name"] not in known]



_check_models()
_check_recipes()
_check_references()
_check_sft_routes()
_check_index_factories()
_check_harr()
