# ragrl: raw corpora and QA sets → indexes → SFT → RL → merged checkpoints → evaluation → tables.
# Where a change goes: config keys in config/schemas/config.schema.yaml, path helpers in
# rules/common.smk, one rule family per file in rules/, the logic in src/ragrl (the `ragrl` CLI).

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/world.smk"
include: "rules/models.smk"
include: "rules/data.smk"
include: "rules/retrieval.smk"
include: "rules/agents.smk"
include: "rules/harr.smk"
include: "rules/results.smk"
include: "rules/kb.smk"
include: "rules/construct_kg.smk"


rule all:
    input:
        all_outputs(),
        construct_kg_outputs(),
    default_target: True
