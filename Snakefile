# ragrl: raw corpora and QA sets → indexes → SFT → RL → merged checkpoints → evaluation → tables.
# Where a change goes: config keys in config/schemas/config.schema.yaml, the workflow's logic (checks,
# runs, paths) in src/ragrl/workflow, input functions in rules/common.smk, one rule family per file
# in rules/, the stages in src/ragrl (the `ragrl` CLI). A pipeline method (ragrl.workflow.pipelines)
# brings its own rule file, included below when config enables it.

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
include: "rules/results.smk"
include: "rules/kb.smk"


for rule_file in WF.rule_files:

    include: rule_file


rule all:
    input:
        WF.all_outputs(),
    default_target: True
