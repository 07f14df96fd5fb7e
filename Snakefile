# accubisect: compile an ONNX model with fusion on and off, dump every op, map fused nodes back to the
# original graph, compare op by op, and bisect the fusion rules that break accuracy.
# Targets: all (default), compile, graph, dump, compare, fusion_bisect, bundle, precision, precision_bisect,
# precision_finalize, reduce (a minimal failing subgraph of the model as a repro: results/reduce/).
# No configfile: a run is configured by --configfile FILE and/or --config key=value only, over the schema's
# defaults, so no example setting leaks into it. The bundled example: --configfile examples/config.yaml.
from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"
include: "rules/compile.smk"
include: "rules/graph.smk"
include: "rules/dump.smk"
include: "rules/compare.smk"
include: "rules/bundle.smk"
include: "rules/precision.smk"


# On OpenVINO, precision_bisect keeps executed nodes in f32 by IR marks, and fusion_bisect searches the
# switches the plugin has (snippets, barrier outputs), each in one job of its own.
if PLAN.backend.name == "openvino-cpu":

    include: "rules/openvino_fusion_bisect.smk"
    include: "rules/openvino_precision_bisect.smk"

else:

    include: "rules/fusion_bisect.smk"
    include: "rules/precision_bisect.smk"


include: "rules/reduce.smk"


rule all:
    default_target: True
    input:
        rules.compare.input,
        rules.fusion_bisect.input,


onsuccess:
    print_end_of_run()
    cancel_scheduler_timers()


onerror:
    cancel_scheduler_timers()
