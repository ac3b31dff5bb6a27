# Knowledge bases in KnowRL's SQLite schema, one per entry of `kbs` (none in the default config:
# an overlay such as config/test/kb/knowrl_kb.yaml asks for them).


rule kb:
    input:
        lambda wc: config["kbs"][wc.kb]["inputs"],
    output:
        f"{RESULTS}/kb/{{kb}}/knowledge_base.db",
    params:
        fmt=lambda wc: ["--format", config["kbs"][wc.kb]["format"]] if config["kbs"][wc.kb].get("format") else [],
        tokenizer=lambda wc: config["kbs"][wc.kb]["tokenizer"],
        max_tokens=lambda wc: config["kbs"][wc.kb]["max_tokens"],
    log:
        "logs/kb/{kb}.log",
    benchmark:
        "benchmarks/kb/{kb}.tsv"
    threads: rule_threads("kb")
    resources:
        **rule_resources("kb"),
    conda:
        "../envs/core.yaml"
    shell:
        "python -m ragrl kb --inputs {input:q} --out {output:q} {params.fmt:q} --tokenizer {params.tokenizer:q}"
        " --max-tokens {params.max_tokens:q} > {log:q} 2>&1"
