# Passages → embedding shards (one job each) → FAISS indexes; BM25; recall of supporting
# passages per retriever; and a check of the HTTP service as Search-R1's client uses it.


rule embed_shard:
    input:
        lambda wc: WF.passages_path(wc.corpus),
    output:
        npy=f"{RESULTS}/embeddings/{{corpus}}/shard-{{shard}}-of-{{n}}.npy",
        meta=f"{RESULTS}/embeddings/{{corpus}}/shard-{{shard}}-of-{{n}}.json",
    params:
        model=config["models"]["embedding"],
        enc=config["retrieval"]["encoder"],
    log:
        "logs/embed_shard/{corpus}/{shard}-of-{n}.log",
    benchmark:
        "benchmarks/embed_shard/{corpus}/{shard}-of-{n}.tsv"
    threads: rule_threads("embed_shard")
    resources:
        **rule_resources("embed_shard"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl index embed-shard --passages {input:q} --model {params.model:q}"
        " --shard {wildcards.shard:q} --num-shards {wildcards.n:q} --out {output.npy:q}"
        " --query-prefix={params.enc[query_prefix]:q} --passage-prefix={params.enc[passage_prefix]:q}"
        " --batch-size {params.enc[batch_size]:q} --max-length {params.enc[max_length]:q} > {log:q} 2>&1"


rule index:
    input:
        passages=lambda wc: WF.passages_path(wc.corpus),
        shards=lambda wc: WF.shard_paths(wc.corpus),
    output:
        [f"{RESULTS}/index/{{corpus}}/{{index}}/{f}" for f in DENSE_INDEX_FILES],
    params:
        factory=lambda wc: config["retrieval"]["indexes"][wc.index],
        train_sample=config["retrieval"]["train_sample"],
        gpu=WF.gpu_flag(),
        out=output_dir,
    log:
        "logs/index/{corpus}/{index}.log",
    benchmark:
        "benchmarks/index/{corpus}/{index}.tsv"
    threads: rule_threads("index")
    resources:
        **rule_resources("index"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl index build --shards {input.shards:q} --factory {params.factory:q}"
        " --passages {input.passages:q} --train-sample {params.train_sample:q} {params.gpu:q} --out {params.out:q}"
        " > {log:q} 2>&1"


rule bm25:
    input:
        lambda wc: WF.passages_path(wc.corpus),
    output:
        directory(f"{RESULTS}/index/{{corpus}}/bm25"),
    log:
        "logs/bm25/{corpus}.log",
    benchmark:
        "benchmarks/bm25/{corpus}.tsv"
    threads: rule_threads("bm25")
    resources:
        **rule_resources("bm25"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl index bm25 --passages {input:q} --out {output:q} > {log:q} 2>&1"


rule retrieval_eval:
    input:
        unpack(retriever_inputs),
        qa=[WF.qa_path(d) for d in WF.eval_datasets()],
    output:
        f"{RESULTS}/retrieval/{{corpus}}/{{retriever}}.json",
    params:
        retriever=retriever_args,
        qa=[f"{d}={WF.qa_path(d)}" for d in WF.eval_datasets()],
        k=config["retrieval"]["eval"]["k"],
    log:
        "logs/retrieval_eval/{corpus}/{retriever}.log",
    benchmark:
        "benchmarks/retrieval_eval/{corpus}/{retriever}.tsv"
    threads: rule_threads("retrieval_eval")
    resources:
        **rule_resources("retrieval_eval"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl retrieval eval {params.retriever:q} --name {wildcards.retriever:q}"
        " --qa {params.qa:q} --k {params.k:q} --out {output:q} > {log:q} 2>&1"


rule retrieval_table:
    input:
        WF.retrieval_reports(),
    output:
        md=f"{RESULTS}/tables/retrieval_recall.md",
        csv=f"{RESULTS}/tables/retrieval_recall.csv",
    log:
        "logs/retrieval_table.log",
    benchmark:
        "benchmarks/retrieval_table.tsv"
    threads: rule_threads("retrieval_table")
    resources:
        **rule_resources("retrieval_table"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl retrieval table --reports {input:q} --out-md {output.md:q} --out-csv {output.csv:q} > {log:q} 2>&1"


rule retrieval_service_check:
    input:
        unpack(retriever_inputs),
        qa=lambda wc: WF.qa_path(WF.eval_datasets()[-1]),
    output:
        f"{RESULTS}/checks/retrieval_service_{{corpus}}_{{retriever}}.json",
    params:
        retriever=retriever_args,
        topk=config["retrieval"]["service"]["topk"],
    log:
        "logs/retrieval_service_check/{corpus}/{retriever}.log",
    benchmark:
        "benchmarks/retrieval_service_check/{corpus}/{retriever}.tsv"
    threads: rule_threads("retrieval_service_check")
    resources:
        **rule_resources("retrieval_service_check"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl retrieval service-check {params.retriever:q} --qa {input.qa:q}"
        " --topk {params.topk:q} --out {output:q} > {log:q} 2>&1"
