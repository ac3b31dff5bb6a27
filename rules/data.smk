# Corpora in public formats → the passages contract; QA sets in public formats → the QA contract.


rule corpus:
    input:
        corpus_inputs,
    output:
        f"{RESULTS}/corpus/{{corpus}}/passages.parquet",
    params:
        fmt=lambda wc: config["corpora"][wc.corpus]["format"],
        words=lambda wc: config["corpora"][wc.corpus]["words"],
        titles=lambda wc: ["--strip-title-quotes"] if config["corpora"][wc.corpus].get("strip_title_quotes") else [],
    log:
        "logs/corpus/{corpus}.log",
    benchmark:
        "benchmarks/corpus/{corpus}.tsv"
    threads: rule_threads("corpus")
    resources:
        **rule_resources("corpus"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl corpus --format {params.fmt:q} --inputs {input:q} --out {output:q}"
        " --words {params.words:q} --source {wildcards.corpus:q} {params.titles:q} > {log:q} 2>&1"


rule qa:
    input:
        qa_source,
    output:
        f"{RESULTS}/qa/{{dataset}}.parquet",
    params:
        fmt=lambda wc: config["datasets"][wc.dataset]["format"],
    log:
        "logs/qa/{dataset}.log",
    benchmark:
        "benchmarks/qa/{dataset}.tsv"
    threads: rule_threads("qa")
    resources:
        **rule_resources("qa"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl qa --format {params.fmt:q} --input {input:q} --out {output:q} > {log:q} 2>&1"
