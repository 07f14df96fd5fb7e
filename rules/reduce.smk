# `snakemake reduce`: the smallest subgraph of the original model that still fails on its own, as a repro
# (bisection/reduce.py). One job runs the search, each probe's verdict kept under workspace/reduce_probe/,
# writes the repro and runs it as written and with the answer of the bisection `reduce.bisection` names.
REDUCE = PLAN.reduce_dir()
REDUCE_SAMPLES = PLAN.sample_names


rule reduce_search:
    input:
        **PLAN.reduce_inputs(),
    output:
        repro_model=REDUCE / "model.onnx",
        repro_inputs=[REDUCE / "inputs" / f"{s}.npz" for s in REDUCE_SAMPLES],
        expected_outputs=[REDUCE / "expected" / f"{s}.npz" for s in REDUCE_SAMPLES],
        candidate_json=REDUCE / "candidate.json",
        repro=REDUCE / "repro.py",
        reduce_json=REDUCE / "reduce.json",
        summary=REDUCE / "summary.txt",
    log:
        REDUCE / "reduce.log",
    benchmark:
        REDUCE / "reduce.benchmark.tsv"
    threads: PLAN.config["bisect"]["parallel"]
    resources:
        mem_mb=RESOURCES["search"]["mem_mb"],
        runtime=RESOURCES["search"]["runtime"],
        gpu=RESOURCES["search"]["gpu"],
    params:
        bisection=PLAN.reduce_kind,
        sample_names=REDUCE_SAMPLES,
        verdicts=PLAN.reduce_store().to_json(),
        variant=PLAN.reduce_variant().to_json(),
        accuracy=PLAN.config["accuracy"],
        backend=PLAN.config["backend"],
        context=LINE_CONTEXT,
        threads=lambda wildcards, threads: threads,
    script:
        "../scripts/reduce.py"


# The repro's folder is published whole: a sample no longer configured leaves no files in it.
rule publish_reduce:
    input:
        model=REDUCE / "model.onnx",
        candidate=REDUCE / "candidate.json",
        repro=REDUCE / "repro.py",
        record=REDUCE / "reduce.json",
        summary=REDUCE / "summary.txt",
        inputs=[REDUCE / "inputs" / f"{s}.npz" for s in REDUCE_SAMPLES],
        expected=[REDUCE / "expected" / f"{s}.npz" for s in REDUCE_SAMPLES],
    output:
        published=published_dir(RESULTS, "reduce") / PUBLISHED,
        published_model=update(published_dir(RESULTS, "reduce") / "model.onnx"),
        published_candidate=update(published_dir(RESULTS, "reduce") / "candidate.json"),
        published_repro=update(published_dir(RESULTS, "reduce") / "repro.py"),
        published_record=update(published_dir(RESULTS, "reduce") / "reduce.json"),
        published_summary=update(published_dir(RESULTS, "reduce") / "summary.txt"),
        published_inputs=[update(published_dir(RESULTS, "reduce") / "inputs" / f"{s}.npz") for s in REDUCE_SAMPLES],
        published_expected=[update(published_dir(RESULTS, "reduce") / "expected" / f"{s}.npz") for s in REDUCE_SAMPLES],
    log:
        REDUCE / "publish.log",
    benchmark:
        REDUCE / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule reduce:
    input:
        rules.publish_reduce.output,
        (rules.publish_fusion_bisect.output if PLAN.reduce_kind == "fusion" else rules.publish_precision_bisect.output),


localrules:
    publish_reduce,
    reduce,
