# Shared helpers: config validation, path functions, per-rule resources.
# No workflow logic lives here; the stages are in src/ragrl.

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

from ragrl.config import config_errors  # noqa: E402
from ragrl.models import ModelNameError, check_model_name  # noqa: E402
from ragrl.paths import DENSE_INDEX_FILES, hf_model_files, world_files  # noqa: E402


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


def _check_references():
    # Names that point at other config entries: a dangling one must fail here, not as a
    # "missing input" deep in the DAG.
    errors = []
    retrieval = config["retrieval"]
    if retrieval["corpus"] not in config["corpora"]:
        errors.append(f"config key 'retrieval.corpus': '{retrieval['corpus']}' is not a key of corpora {sorted(config['corpora'])}")
    for i, name in enumerate(retrieval["eval"]["datasets"]):
        if name not in config["datasets"]:
            errors.append(f"config key 'retrieval.eval.datasets[{i}]': '{name}' is not a key of datasets {sorted(config['datasets'])}")
    for name in retrieval["indexes"]:
        if name in ("bm25", "hybrid"):
            errors.append(f"config key 'retrieval.indexes.{name}': '{name}' is reserved for the sparse/hybrid retrievers")
    if retrieval["hybrid"] and not (retrieval["bm25"] and retrieval["indexes"]):
        errors.append("config key 'retrieval.hybrid': needs retrieval.bm25 and at least one dense index")
    if errors:
        raise WorkflowError("invalid config:\n  " + "\n  ".join(errors))


_check_models()
_check_references()

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


def policy_dir():
    """The base policy: the locally built tiny model, or whatever config names."""
    policy = config["models"]["policy"]
    return tiny_model_dir() if policy == "tiny" else policy


def policy_inputs():
    # A hub id or an external path is not a workflow output, so rules depend on it only by name.
    if config["models"]["policy"] == "tiny":
        return [f"{tiny_model_dir()}/{f}" for f in hf_model_files()]
    return []


def output_dir(wildcards, output):
    """The directory of a rule's first output (a stage's --out), derived so it works without a shared FS."""
    return os.path.dirname(output[0])


def input_dir(wildcards, input):
    return os.path.dirname(input[0])


def policy_param(wildcards, input):
    # The built tiny policy is an input file; a hub id or an external path is passed by name.
    return os.path.dirname(input[0]) if input else config["models"]["policy"]


def rule_resources(rule_name):
    """Resources from config: the entry named after the rule, over the default entry."""
    merged = dict(config["resources"]["default"])
    merged.update(config["resources"]["rules"].get(rule_name, {}))
    merged.setdefault("mem_mb", 2000)
    merged.setdefault("runtime", 30)
    merged.setdefault("gpu", 0)
    merged.pop("threads", None)
    return merged


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
    corpus, name = wildcards.corpus, wildcards.retriever
    first_dense = next(iter(config["retrieval"]["indexes"]), None)
    dense = name if name in config["retrieval"]["indexes"] else (first_dense if name == "hybrid" else None)
    inputs = {}
    if dense is not None:
        inputs["index"] = f"{dense_index_dir(corpus, dense)}/meta.json"
    if name in ("bm25", "hybrid"):
        inputs["bm25"] = bm25_dir(corpus)
    return inputs


def retriever_args(wildcards, input):
    """CLI flags selecting that retriever: --index DIR, --bm25 DIR, --mode."""
    args = []
    if "index" in input.keys():
        args += ["--index", os.path.dirname(input["index"])]
    if "bm25" in input.keys():
        args += ["--bm25", input["bm25"]]
    mode = {"bm25": "bm25", "hybrid": "hybrid"}.get(wildcards.retriever, "dense")
    return " ".join(args + ["--mode", mode])


def eval_datasets():
    return config["retrieval"]["eval"]["datasets"]


def retrieval_reports():
    corpus = config["retrieval"]["corpus"]
    return [f"{RESULTS}/retrieval/{corpus}/{r}.json" for r in retrievers()]


def all_outputs():
    outputs = world_outputs()
    outputs.append(f"{RESULTS}/checks/policy_generate.txt")
    outputs += [passages_path(c) for c in config["corpora"]]
    outputs += [qa_path(d) for d in config["datasets"]]
    if eval_datasets():
        corpus, hybrid = config["retrieval"]["corpus"], retrievers()[-1]
        outputs += [f"{RESULTS}/tables/retrieval_recall.md",
                    f"{RESULTS}/checks/retrieval_service_{corpus}_{hybrid}.json"]
    return outputs
