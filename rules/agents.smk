# Agents (any method of ragrl.methods: Search-R1, RAG-R1, KG-R1, plug-ins): cold-start SFT data
# (gold, teacher or imported) → SFT → merge → RL → merge → evaluation of every run (base,
# no-retrieval, SFT, SFT+RL) on its evaluation datasets. What a recipe's environment reads comes
# from its method's input kinds: a retriever's indexes, the KG its dataset names in config.


rule sft_data:
    input:
        unpack(lambda wc: WF.recipe_env_inputs(wc.recipe)),
        unpack(lambda wc: WF.sft_import_inputs(wc.recipe)),
        qa=lambda wc: WF.qa_path(WF.recipe(wc.recipe)["train_dataset"]),
        policy=WF.policy_inputs(),
    output:
        data=f"{RESULTS}/sft_data/{{recipe}}.parquet",
        stats=f"{RESULTS}/sft_data/{{recipe}}.stats.json",
    params:
        recipe=lambda wc: recipe_json(WF.recipe_part(wc.recipe, "sft_data")),
        env=recipe_env_flags,
        policy=policy_arg,
        limit=lambda wc: WF.recipe(wc.recipe)["sft"].get("limit") or 0,
    log:
        main="logs/sft_data/{recipe}.log",
        # A teacher this job serves itself (sft.teacher without base_url, ragrl.serving).
        server="logs/sft_data/{recipe}.server.log",
    benchmark:
        "benchmarks/sft_data/{recipe}.tsv"
    priority: lambda wc: WF.train_priority(wc.recipe, "sft")
    threads: rule_threads("sft_data")
    resources:
        **rule_resources("sft_data"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl sft-data --recipe {params.recipe:q} --recipe-name {wildcards.recipe:q} {params.env:q}"
        " --qa {input.qa:q} --policy {params.policy:q} --limit {params.limit:q} --out {output.data:q}"
        " --server-log {log.server:q} > {log.main:q} 2>&1"


rule sft:
    input:
        data=f"{RESULTS}/sft_data/{{recipe}}.parquet",
        policy=WF.policy_inputs(),
    output:
        directory(f"{RESULTS}/models/{{recipe}}/sft"),
    params:
        recipe=lambda wc: recipe_json(WF.recipe_part(wc.recipe, "sft")),
        policy=policy_arg,
    log:
        "logs/sft/{recipe}.log",
    benchmark:
        "benchmarks/sft/{recipe}.tsv"
    priority: lambda wc: WF.train_priority(wc.recipe, "sft")
    threads: rule_threads("sft")
    resources:
        **rule_resources("sft"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl sft --recipe {params.recipe:q} --recipe-name {wildcards.recipe:q}"
        " --data {input.data:q} --policy {params.policy:q} --out {output:q} > {log:q} 2>&1"


rule merge_sft:
    input:
        adapter=f"{RESULTS}/models/{{recipe}}/sft",
        policy=WF.policy_inputs(),
    output:
        directory(f"{RESULTS}/models/{{recipe}}/sft_merged"),
    params:
        policy=policy_arg,
    log:
        "logs/merge/{recipe}_sft.log",
    benchmark:
        "benchmarks/merge_sft/{recipe}.tsv"
    priority: lambda wc: WF.train_priority(wc.recipe, "sft")
    threads: rule_threads("merge")
    resources:
        **rule_resources("merge"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl merge --base {params.policy:q} --adapter {input.adapter:q} --out {output:q} > {log:q} 2>&1"


rule rl:
    input:
        unpack(lambda wc: WF.recipe_env_inputs(wc.recipe)),
        qa=lambda wc: WF.qa_path(WF.recipe(wc.recipe)["train_dataset"]),
        start=lambda wc: WF.rl_start_model(wc.recipe) if WF.sft_enabled(wc.recipe) else WF.policy_inputs(),
    output:
        # Only the finished artefacts are outputs: checkpoints under work/checkpoints survive a
        # killed job (Snakemake deletes a failed job's outputs), so a re-run resumes from them.
        model=f"{RESULTS}/train/{{recipe}}_rl/work/final/model.safetensors",
        log=f"{RESULTS}/train/{{recipe}}_rl/train_log.jsonl",
    params:
        recipe=lambda wc: recipe_json(WF.recipe_part(wc.recipe, "rl")),
        env=recipe_env_flags,
        start=lambda wc, input: input.start if WF.sft_enabled(wc.recipe) else policy_param(wc, input.start),
        work=lambda wc, output: os.path.dirname(os.path.dirname(output.model)),
        limit=lambda wc: WF.recipe(wc.recipe)["rl"].get("limit") or 0,
    log:
        "logs/rl/{recipe}.log",
    benchmark:
        "benchmarks/rl/{recipe}.tsv"
    # An RL job gates its merge and two evaluations: started before the ready leaf jobs, it keeps
    # the DAG's tail short (left to the scheduler, RAG-R1's RL once waited 6 minutes for a core).
    # A recipe whose model a pipeline reads (HARR's generator) goes first of all (train_priority).
    priority: lambda wc: WF.train_priority(wc.recipe, "rl", 1)
    threads: rule_threads("rl")
    resources:
        **rule_resources("rl"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl rl --recipe {params.recipe:q} --recipe-name {wildcards.recipe:q} {params.env:q}"
        " --qa {input.qa:q} --policy {params.start:q} --limit {params.limit:q} --out {params.work:q}"
        " --log-out {output.log:q} > {log:q} 2>&1"


rule merge_rl:
    input:
        adapter=f"{RESULTS}/train/{{recipe}}_rl/work/final/model.safetensors",
        base=lambda wc: WF.rl_start_model(wc.recipe) if WF.sft_enabled(wc.recipe) else WF.policy_inputs(),
    output:
        directory(f"{RESULTS}/models/{{recipe}}/rl_merged"),
    params:
        adapter=lambda wc, input: os.path.dirname(input.adapter),
        base=lambda wc, input: input.base if WF.sft_enabled(wc.recipe) else policy_param(wc, input.base),
    log:
        "logs/merge/{recipe}_rl.log",
    benchmark:
        "benchmarks/merge_rl/{recipe}.tsv"
    priority: lambda wc: WF.train_priority(wc.recipe, "rl")
    threads: rule_threads("merge")
    resources:
        **rule_resources("merge"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl merge --base {params.base:q} --adapter {params.adapter:q} --out {output:q} > {log:q} 2>&1"


# One job per run, all its datasets in one process: the interpreter, torch, the policy and the
# index load once (start-up was most of a toy evaluation job). Runs still evaluate in parallel.
rule eval:
    input:
        unpack(run_inputs),
    output:
        directory(f"{RESULTS}/eval/{{run}}"),
    params:
        recipe=run_settings_json,
        name=lambda wc: WF.runs[wc.run].recipe,
        env=run_env_args,
        model=run_model_arg,
        max_questions=config["evaluation"]["max_questions"] or 0,
        batch_size=config["evaluation"]["batch_size"],
    log:
        "logs/eval/{run}.log",
    benchmark:
        "benchmarks/eval/{run}.tsv"
    threads: rule_threads("eval")
    resources:
        **rule_resources("eval"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl eval --recipe {params.recipe:q} --recipe-name {params.name:q} {params.env:q}"
        " --model {params.model:q} --run-id {wildcards.run:q} --max-questions {params.max_questions:q}"
        " --batch-size {params.batch_size:q} --out {output:q} > {log:q} 2>&1"


rule run_manifest:
    output:
        f"{RESULTS}/runs/{{run}}/run.json",
    params:
        recipe=lambda wc: WF.runs[wc.run].recipe,
        stage=lambda wc: WF.runs[wc.run].stage,
        model=config["models"]["policy"],
        settings=lambda wc: recipe_json(WF.run_definition(wc.run)),
        seeds=lambda wc: recipe_json({"world": config["world"]["seed"],
                                      "train": WF.runs[wc.run].settings.get("seed", 0)}),
    log:
        "logs/run_manifest/{run}.log",
    benchmark:
        "benchmarks/run_manifest/{run}.tsv"
    threads: 1
    resources:
        **rule_resources("run_manifest"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl run-manifest --run-id {wildcards.run:q} --recipe-name {params.recipe:q} --model {params.model:q}"
        " --stage {params.stage:q} --settings {params.settings:q} --seeds {params.seeds:q} --out {output:q} > {log:q} 2>&1"
