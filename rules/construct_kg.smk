# AutoGraph-R1's inference stage: a corpus-level KG built by a constructor model from every passage,
# in the KG store's format (serve-kg serves it). Jobs exist for the constructors config
# `construct_kg` names: on the default, the autograph_r1 recipe's untrained, SFT and RL policies.
# A pipeline method (ragrl.workflow.pipelines): included only when config names `construct_kg`.

GRAPHS = WF.pipeline("construct_kg")


rule construct_kg:
    input:
        unpack(lambda wc: GRAPHS.constructor_inputs(wc.constructor)),
    output:
        triples=f"{RESULTS}/kg_built/{{constructor}}/triples.parquet",
        stats=f"{RESULTS}/kg_built/{{constructor}}/construction.json",
    params:
        model=lambda wc, input: GRAPHS.constructor_model(wc.constructor, input.model),
        out=lambda wc, output: os.path.dirname(output.triples),
        # Finished batches live outside the outputs: Snakemake deletes a failed job's outputs, the
        # work directory survives a kill and the re-run resumes from it.
        work=lambda wc: f"{RESULTS}/kg_built/{wc.constructor}.work",
        batch=lambda wc: GRAPHS.settings().get("batch_size", 16),
        tokens=lambda wc: GRAPHS.settings().get("max_turn_tokens", 256),
        limit=lambda wc: GRAPHS.settings().get("limit") or 0,  # 0: every passage
        system=lambda wc: GRAPHS.settings().get("system_prompt") or "",  # "": ragrl's
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
        " --limit {params.limit:q} --system-prompt {params.system:q} > {log:q} 2>&1"


# The benchmark: each graph (constructors' KGs, gold KGs) as a passage index. The PPR retriever
# ranks the corpus for every question of construct_kg.datasets: recall@2/5 of the supporting
# passages (metrics.json, run graph_<graph>) and the ranking a reader run answers from
# (runs graph_<graph>_reader, rule eval, stage "graph").
rule graph_rank:
    input:
        triples=lambda wc: GRAPHS.triples(wc.graph),
        passages=lambda wc: WF.passages_path(GRAPHS.settings()["corpus"]),
        qa=lambda wc: WF.qa_path(wc.dataset),
    output:
        metrics=f"{RESULTS}/graph_rag/graph_{{graph}}/{{dataset}}/metrics.json",
        ranking=f"{RESULTS}/graph_rag/graph_{{graph}}/{{dataset}}/ranking.parquet",
    params:
        out=lambda wc, output: os.path.dirname(output.metrics),
        embedding=config["models"]["embedding"],
        max_questions=config["evaluation"]["max_questions"] or 0,
    log:
        "logs/graph_rank/{graph}/{dataset}.log",
    benchmark:
        "benchmarks/graph_rank/{graph}/{dataset}.tsv"
    wildcard_constraints:
        graph="[A-Za-z0-9_]+",
        dataset="[^/]+",
    threads: rule_threads("graph_rank")
    resources:
        **rule_resources("graph_rank"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl graph-rank --triples {input.triples:q} --passages {input.passages:q} --qa {input.qa:q}"
        " --run-id graph_{wildcards.graph:q} --dataset {wildcards.dataset:q} --embedding-model {params.embedding:q}"
        " --max-questions {params.max_questions:q} --out {params.out:q} > {log:q} 2>&1"


rule graph_manifest:
    output:
        f"{RESULTS}/graph_rag/runs/graph_{{graph}}/run.json",
    params:
        settings=lambda wc: recipe_json({"graph": GRAPHS.definition(wc.graph), "world": config["world"]}),
        seeds=lambda wc: recipe_json({"world": config["world"]["seed"]}),
        model=config["models"]["embedding"],
    log:
        "logs/graph_manifest/{graph}.log",
    benchmark:
        "benchmarks/graph_manifest/{graph}.tsv"
    wildcard_constraints:
        graph="[A-Za-z0-9_]+",
    threads: 1
    resources:
        **rule_resources("run_manifest"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl run-manifest --run-id graph_{wildcards.graph:q} --recipe-name construct_kg"
        " --model {params.model:q} --stage graph --settings {params.settings:q} --seeds {params.seeds:q}"
        " --out {output:q} > {log:q} 2>&1"
