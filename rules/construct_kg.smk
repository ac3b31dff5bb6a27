# AutoGraph-R1's inference stage: a corpus-level KG built by a constructor model from every passage,
# in the KG store's format (serve-kg serves it). Jobs exist only for the constructors config
# `construct_kg` names (overlay config/construct_kg.yaml); the default config names none, so the
# default DAG is unchanged.


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
