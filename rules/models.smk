# Models the workflow builds itself: the tiny policy of the embedded default, and a smoke check
# that whatever policy config names loads with Auto* classes and generates.


rule tiny_model:
    input:
        WF.world_outputs(),
    output:
        [f"{WF.tiny_model_dir()}/{f}" for f in hf_model_files()],
    params:
        world=input_dir,
        out=output_dir,
        spec=config["models"]["tiny"],
    log:
        "logs/tiny_model.log",
    benchmark:
        "benchmarks/tiny_model.tsv"
    threads: rule_threads("tiny_model")
    resources:
        **rule_resources("tiny_model"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl model tiny --world {params.world:q} --out {params.out:q}"
        " --vocab-size {params.spec[vocab_size]:q} --hidden-size {params.spec[hidden_size]:q}"
        " --num-layers {params.spec[num_layers]:q} --num-heads {params.spec[num_heads]:q}"
        " --num-kv-heads {params.spec[num_kv_heads]:q} --intermediate-size {params.spec[intermediate_size]:q}"
        " --seed {params.spec[seed]:q} > {log:q} 2>&1"


rule pretrain:
    # The tiny model (tokenizer and weights) pretrained to read on synthetic text with fresh names,
    # none of the world's (src/ragrl/train/pretrain.py). With pretrain.enabled it is the tiny base
    # policy: the `base` run and every recipe's SFT start from it.
    input:
        WF.world_outputs(),
    output:
        [f"{WF.pretrained_dir()}/{f}" for f in hf_model_files()],
        plot=f"{RESULTS}/plots/pretrain_loss.png",
    params:
        world=input_dir,
        out=output_dir,
        spec=config["models"]["tiny"],
        settings=lambda wc: json.dumps(config["pretrain"]["settings"], sort_keys=True),
        # Pretrained models shipped with the repository, by cache key (ragrl.train.pretrain.cache_key):
        # the default's is there, so a fresh clone copies it instead of pretraining for half an hour.
        cache=config["pretrain"]["cache"],
    log:
        "logs/pretrain.log",
    benchmark:
        "benchmarks/pretrain.tsv"
    threads: rule_threads("pretrain")
    resources:
        **rule_resources("pretrain"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl pretrain --world {params.world:q} --out {params.out:q} --plot {output.plot:q}"
        " --settings {params.settings:q} --cache {params.cache:q}"
        " --vocab-size {params.spec[vocab_size]:q} --hidden-size {params.spec[hidden_size]:q}"
        " --num-layers {params.spec[num_layers]:q} --num-heads {params.spec[num_heads]:q}"
        " --num-kv-heads {params.spec[num_kv_heads]:q} --intermediate-size {params.spec[intermediate_size]:q}"
        " --seed {params.spec[seed]:q} > {log:q} 2>&1"


rule policy_generate:
    input:
        WF.policy_inputs(),
    output:
        f"{RESULTS}/checks/policy_generate.txt",
    params:
        model=policy_param,
    log:
        "logs/policy_generate.log",
    benchmark:
        "benchmarks/policy_generate.tsv"
    threads: rule_threads("policy_generate")
    resources:
        **rule_resources("policy_generate"),
    conda:
        "../envs/train.yaml"
    shell:
        "python -m ragrl model generate --model {params.model:q} --prompt 'Where was' --out {output:q} > {log:q} 2>&1"
