# HARR (docs/HARR.md): RL for the dense retriever's query encoder. A trained agent run (config
# harr.generator) is the frozen generator and the corpus with its unchanged FAISS index the
# environment: filter the training questions -> train the encoder (history-aware states, and the
# query-only ablation) -> evaluate the frozen generator with the frozen / HARR / no-history encoder
# (deterministic top-k) -> the encoders' recall@k on multi-hop questions -> tables harr_*. Jobs
# exist when config names `harr` (the default does; `harr: null` drops them). A generator with
# `serve` runs in a vLLM server that each job starts and stops (log.server). A pipeline method
# (ragrl.workflow.pipelines): the Snakefile includes this file only when config names `harr`.

from ragrl.recipe import HARR_RUNS

HARR = WF.pipeline("harr")


rule harr_filter:
    input:
        unpack(lambda wc: HARR.world_inputs()),
        qa=lambda wc: WF.qa_path(HARR.settings()["train_dataset"]),
    output:
        kept=f"{RESULTS}/harr/filter/kept.parquet",
        stats=f"{RESULTS}/harr/filter/kept.stats.json",
    params:
        recipe=lambda wc: HARR.generator_json(),
        name=lambda wc: HARR.generator().recipe,
        harr=lambda wc: HARR.json(),
        generator=lambda wc, input: HARR.generator_arg(input.generator),
        endpoint=lambda wc: HARR.endpoint_args(),
        index=lambda wc, input: os.path.dirname(input.index),
    log:
        main="logs/harr/filter.log",
        server="logs/harr/serve/filter.log",
    benchmark:
        "benchmarks/harr_filter.tsv"
    # The filter and the trainings are the default DAG's longest chain (about 10 minutes after the
    # generator's SFT), so they and the generator's training jobs run first (Workflow.train_priority).
    priority: WF.CHAIN_PRIORITY
    threads: rule_threads("harr_filter")
    resources:
        **rule_resources("harr_filter"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl harr-filter --recipe {params.recipe:q} --recipe-name {params.name:q} --harr {params.harr:q}"
        " --generator {params.generator:q} {params.endpoint:q} --server-log {log.server:q}"
        " --index {params.index:q} --passages {input.passages:q} --qa {input.qa:q}"
        " --threads {threads:q} --out {output.kept:q} > {log.main:q} 2>&1"


rule harr_train:
    input:
        unpack(lambda wc: HARR.world_inputs()),
        qa=f"{RESULTS}/harr/filter/kept.parquet",
    output:
        # Only the finished artefacts are outputs: checkpoints and the running log under work/
        # survive a killed job (Snakemake deletes a failed job's outputs), so a re-run resumes
        # from them with the earlier steps' log lines; the log is copied out when training ends.
        final=f"{RESULTS}/harr/train/{{run}}/work/final/state.json",
        log=f"{RESULTS}/harr/train/{{run}}/train_log.jsonl",
    params:
        recipe=lambda wc: HARR.generator_json(),
        name=lambda wc: HARR.generator().recipe,
        harr=lambda wc: HARR.json(),
        generator=lambda wc, input: HARR.generator_arg(input.generator),
        endpoint=lambda wc: HARR.endpoint_args(),
        index=lambda wc, input: os.path.dirname(input.index),
        history=lambda wc: HARR.history_flag(wc.run),
        out=lambda wc, output: os.path.dirname(os.path.dirname(output.final)),
    log:
        main="logs/harr/train/{run}.log",
        server="logs/harr/serve/train/{run}.log",
    benchmark:
        "benchmarks/harr_train/{run}.tsv"
    wildcard_constraints:
        run="harr|harr_no_history",
    priority: WF.CHAIN_PRIORITY  # the longest chain: see harr_filter
    threads: rule_threads("harr_train")
    resources:
        **rule_resources("harr_train"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl harr-train --recipe {params.recipe:q} --recipe-name {params.name:q} --harr {params.harr:q}"
        " --generator {params.generator:q} {params.endpoint:q} --server-log {log.server:q}"
        " --index {params.index:q} --passages {input.passages:q} --qa {input.qa:q}"
        " --threads {threads:q} {params.history:q} --out-dir {params.out:q} --log-out {output.log:q} > {log.main:q} 2>&1"


rule harr_eval:
    input:
        unpack(lambda wc: HARR.world_inputs()),
        unpack(lambda wc: HARR.encoder_inputs(wc.run)),
        qa=lambda wc: WF.qa_path(wc.dataset),
    output:
        predictions=f"{RESULTS}/harr/eval/{{run}}/{{dataset}}/predictions.parquet",
        metrics=f"{RESULTS}/harr/eval/{{run}}/{{dataset}}/metrics.json",
    params:
        recipe=lambda wc: HARR.generator_json(),
        name=lambda wc: HARR.generator().recipe,
        harr=lambda wc: HARR.json(),
        generator=lambda wc, input: HARR.generator_arg(input.generator),
        endpoint=lambda wc: HARR.endpoint_args(),
        index=lambda wc, input: os.path.dirname(input.index),
        encoder=lambda wc, input: HARR.encoder_args(input),
        history=lambda wc: HARR.history_flag(wc.run),
        max_questions=config["evaluation"]["max_questions"] or 0,
        batch_size=config["evaluation"]["batch_size"],
        out=lambda wc, output: os.path.dirname(output.metrics),
    log:
        main="logs/harr/eval/{run}/{dataset}.log",
        server="logs/harr/serve/eval/{run}/{dataset}.log",
    benchmark:
        "benchmarks/harr_eval/{run}/{dataset}.tsv"
    wildcard_constraints:
        run="|".join(HARR_RUNS),
    threads: rule_threads("harr_eval")
    resources:
        **rule_resources("harr_eval"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl harr-eval --recipe {params.recipe:q} --recipe-name {params.name:q} --harr {params.harr:q}"
        " --generator {params.generator:q} {params.endpoint:q} --server-log {log.server:q}"
        " --index {params.index:q} --passages {input.passages:q} --qa {input.qa:q}"
        " --threads {threads:q} {params.history:q} {params.encoder:q} --run-id {wildcards.run:q}"
        " --dataset {wildcards.dataset:q} --max-questions {params.max_questions:q} --batch-size {params.batch_size:q}"
        " --out {params.out:q} > {log.main:q} 2>&1"


rule harr_recall:
    input:
        unpack(lambda wc: HARR.encoder_inputs(wc.run)),
        index=lambda wc: HARR.world_inputs()["index"],
        passages=lambda wc: HARR.world_inputs()["passages"],
        qa=lambda wc: WF.qa_path(wc.dataset),
    output:
        f"{RESULTS}/harr/recall/{{run}}/{{dataset}}/metrics.json",
    params:
        harr=lambda wc: HARR.json(),
        index=lambda wc, input: os.path.dirname(input.index),
        encoder=lambda wc, input: HARR.encoder_args(input),
        history=lambda wc: HARR.history_flag(wc.run),
    log:
        "logs/harr/recall/{run}/{dataset}.log",
    benchmark:
        "benchmarks/harr_recall/{run}/{dataset}.tsv"
    wildcard_constraints:
        run="|".join(HARR_RUNS),
    threads: rule_threads("harr_recall")
    resources:
        **rule_resources("harr_recall"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl harr-recall --harr {params.harr:q} --index {params.index:q} --passages {input.passages:q}"
        " --qa {input.qa:q} --threads {threads:q} {params.history:q} {params.encoder:q} --run-id {wildcards.run:q}"
        " --dataset {wildcards.dataset:q} --out {output:q} > {log:q} 2>&1"


rule harr_manifest:
    output:
        f"{RESULTS}/harr/runs/{{run}}/run.json",
    params:
        model=config["models"]["embedding"],
        settings=lambda wc: recipe_json({"harr": HARR.parsed.to_config(), "run": wc.run,
                                         "generator": HARR.generator_definition(),
                                         "world": config["world"]}),
        seeds=lambda wc: recipe_json({"world": config["world"]["seed"], "train": HARR.parsed.train.seed}),
    log:
        "logs/harr/manifest/{run}.log",
    benchmark:
        "benchmarks/harr_manifest/{run}.tsv"
    wildcard_constraints:
        run="|".join(HARR_RUNS),
    threads: 1
    resources:
        **rule_resources("run_manifest"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl run-manifest --run-id {wildcards.run:q} --recipe-name harr --model {params.model:q}"
        " --stage {wildcards.run:q} --settings {params.settings:q} --seeds {params.seeds:q} --out {output:q} > {log:q} 2>&1"
