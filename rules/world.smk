# The synthetic world of the embedded default: passages, QA splits, two KGs, a knowledge base.


rule world:
    output:
        WF.world_outputs(),
    params:
        seed=config["world"]["seed"],
        size=config["world"]["size"],
        out=output_dir,
    log:
        "logs/world.log",
    benchmark:
        "benchmarks/world.tsv"
    threads: rule_threads("world")
    resources:
        **rule_resources("world"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl world --seed {params.seed:q} --size {params.size:q} --out {params.out:q} > {log:q} 2>&1"
