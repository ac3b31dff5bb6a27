# Every run's manifest, metrics, predictions and training log (plus all job benchmarks) → one
# DuckDB database → paper-style tables and plots, all included in `snakemake --report`.


rule results_db:
    input:
        runs=WF.run_manifests() + WF.from_pipelines("manifests"),
        # Each run's evaluation directory (files listed in params), the pipeline methods' files.
        eval_dirs=WF.eval_outputs(),
        pipelines=WF.pipeline_results(),
        # Named by run id (<recipe>_rl): the database files a training log under its run.
        train_logs=[f"{RESULTS}/train/{r}_rl/train_log.jsonl" for r in config["recipes"]] + WF.from_pipelines("train_logs"),
    output:
        f"{RESULTS}/ragrl.duckdb",
    params:
        evals=WF.eval_files("metrics.json") + WF.from_pipelines("evals"),
        predictions=WF.eval_files("predictions.parquet") + WF.from_pipelines("predictions"),
        rule_gpus=lambda wc: recipe_json(WF.rule_gpus()),
        tables=recipe_json(WF.tables()),
        main_metric=config["results"]["main_metric"],
        lineage=lambda wc: recipe_json(lineage(WF)),
    log:
        "logs/results_db.log",
    benchmark:
        "benchmarks/results_db.tsv"
    threads: 1
    resources:
        **rule_resources("results_db"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl results build --db {output:q} --runs {input.runs:q} --evals {params.evals:q}"
        " --predictions {params.predictions:q} --train-logs {input.train_logs:q} --benchmarks-dir benchmarks"
        " --rule-gpus {params.rule_gpus:q} --tables {params.tables:q} --main-metric {params.main_metric:q}"
        " --lineage {params.lineage:q} > {log:q} 2>&1"


rule results_tables:
    input:
        f"{RESULTS}/ragrl.duckdb",
    output:
        report(
            expand(f"{RESULTS}/tables/{{name}}.{{ext}}", name=WF.table_names(), ext=["md", "csv", "tex"])
            # Each table's paired differences (run − the run it is compared with, 95% interval).
            + expand(f"{RESULTS}/tables/{{name}}_delta.{{ext}}", name=WF.table_names(), ext=["md", "csv"]),
            category="Tables",
        ),
    params:
        tables=recipe_json(WF.tables()),
        out=lambda wc, output: os.path.dirname(output[0]),
    log:
        "logs/results_tables.log",
    benchmark:
        "benchmarks/results_tables.tsv"
    threads: 1
    resources:
        **rule_resources("results_tables"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl results tables --db {input:q} --tables {params.tables:q} --out-dir {params.out:q} > {log:q} 2>&1"


rule results_plots:
    input:
        f"{RESULTS}/ragrl.duckdb",
    output:
        report(
            [f"{RESULTS}/plots/{safe_name(r)}_training.png" for r in WF.trained_runs()]
            + [f"{RESULTS}/plots/reward_curves.png"]
            + [f"{RESULTS}/plots/{kind}_{safe_name(m)}.png" for kind in ("metrics", "paired")
               for m in config["results"]["plot_metrics"]]
            + [f"{RESULTS}/plots/family_{safe_name(f)}.png" for f in run_families(WF)],
            category="Plots",
        ),
    params:
        metrics=config["results"]["plot_metrics"],
        out=lambda wc, output: os.path.dirname(output[0]),
    log:
        "logs/results_plots.log",
    benchmark:
        "benchmarks/results_plots.tsv"
    threads: 1
    resources:
        **rule_resources("results_plots"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl results plots --db {input:q} --metrics {params.metrics:q} --out-dir {params.out:q} > {log:q} 2>&1"
