# AutoGraph-R1's inference stage: a corpus-level KG built by a constructor model from every passage,
# in the KG store's format (serve-kg serves it). Jobs exist only for the constructors config
# `construct_kg` names (overlay config/construct_kg.yaml); the default config names none, so the
# default DAG is unchanged.


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
    # "policy": the base policy (the built tiny model is a workflow output); else a path or hub id.
    return {"passages": passages_path(construct_kg_settings()["corpus"]),
            "model": policy_inputs() if constructor_spec(wildcards) == "policy" else []}


def constructor_model(wildcards, input):
    model = constructor_spec(wildcards)
    return policy_param(wildcards, input.model) if model == "policy" else model


rule construct_kg:
    input:
        unpack(constructor_inputs),
    output:
        triples=f"{RESULTS}/kg_built/{{constructor}}/triples.parquet",
        stats=f"{RESULTS}/kg_built/{{constructor}}/construction.json",
    params:
        model=constructor_model,
        out=lambda wc, output: os.path.dirname(output.triples),
        # Finished batches live outside the outputs: Snakemake deletes a failed job's outputs, the
        # work directory survives a kill and the re-run resumes from it.
        work=lambda wc: f"{RESULTS}/kg_built/{wc.constructor}.work",
        batch=lambda wc: construct_kg_settings().get("batch_size", 16),
        tokens=lambda wc: construct_kg_settings().get("max_turn_tokens", 256),
        limit=lambda wc: construct_kg_settings().get("limit") or 0,  # 0: every passage
    log:
        "logs/construct_kg/{constructor}.log",
    benchmark:
        "benchmarks/construct_kg/{constructor}.tsv"
    threads: rule_threads("construct_kg")
    resources:
        **rule_resources("construct_kg"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl construct-kg --passages {input.passages:q} --model {params.model:q} --out {params.out:q}"
        " --work {params.work:q} --batch-size {params.batch:q} --max-turn-tokens {params.tokens:q}"
        " --limit {params.limit:q} > {log:q} 2>&1"
