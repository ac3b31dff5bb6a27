# The rule of the qa_count pipeline plug-in (qa_count.py): the Snakefile includes this file when
# config names the plug-in under `pipelines:`; WF and RESULTS are the workflow's (rules/common.smk).


rule qa_count:
    input:
        qa=lambda wc: WF.qa_path(wc.dataset),
    output:
        f"{RESULTS}/qa_count/{{dataset}}.json",
    log:
        "logs/qa_count/{dataset}.log",
    shell:
        "python -c 'import json, sys, pyarrow.parquet as pq;"
        " json.dump({{\"questions\": pq.read_metadata(sys.argv[1]).num_rows}}, open(sys.argv[2], \"w\"))'"
        " {input.qa:q} {output:q} > {log:q} 2>&1"
