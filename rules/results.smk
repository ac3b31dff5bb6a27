# Every run's manifest, metrics, predictions and training log (plus all job benchmarks) → one
# DuckDB database → paper-style tables and plots, all included in `snakemake --report`.


rule results_db:
    input:
        runs=run_manifests() + harr_manifests() + graph_manifests(),
        # Each run's evaluation directory (files listed in params), HARR's evaluation files.
        eval_dirs=eval_outputs(),
        harr=harr_eval_outputs() + harr_recall_outputs() + harr_predictions(),
        graphs=graph_rank_outputs(),
        # Named by run id (<recipe>_rl): the database files a training log under its run.
        train_logs=[f"{RESULTS}/train/{r}_rl/train_log.jsonl" for r in config["recipes"]] + harr_train_logs(),
    output:
        f"{RESULTS}/ragrl.duckdb",
    params:
        evals=eval_files("metrics.json") + harr_eval_outputs() + harr_recall_outputs() + graph_rank_outputs(),
        predictions=eval_files("predictions.parquet") + harr_predictions(),
        rule_gpus=lambda wc: recipe_json(rule_gpus()),
        tables=recipe_json(config["results"]["tables"]),
        main_metric=config["results"]["main_metric"],
        lineage=lambda wc: recipe_json(run_lineage()),
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
            expand(f"{RESULTS}/tables/{{name}}.{{ext}}", name=table_names(), ext=["md", "csv", "tex"])
            # Each table's paired differences (run − the run it is compared with, 95% interval).
            + expand(f"{RESULTS}/tables/{{name}}_delta.{{ext}}", name=table_names(), ext=["md", "csv"]),
            category="Tables",
        ),
    params:
        tables=recipe_json(config["results"]["tables"]),
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
            [f"{RESULTS}/plots/{safe_name(r)}_training.png" for r in trained_runs()]
            + [f"{RESULTS}/plots/reward_curves.png"]
            + [f"{RESULTS}/plots/{kind}_{safe_name(m)}.png" for kind in ("metrics", "paired")
               for m in config["results"]["plot_metrics"]]
            + [f"{RESULTS}/plots/family_{safe_name(f)}.png" for f in run_families()],
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
