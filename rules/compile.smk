rule compile_variant:
    input:
        model=PLAN.model,
    output:
        compiled_model=stage_dir(WS, "compile") / "model.onnx",
        compile_record=stage_dir(WS, "compile") / "compile.json",
    log:
        stage_dir(WS, "compile") / "compile.log",
    benchmark:
        stage_dir(WS, "compile") / "compile.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["compile"]["mem_mb"],
        runtime=RESOURCES["compile"]["runtime"],
        gpu=RESOURCES["compile"]["gpu"],
    params:
        threads=lambda wildcards, threads: threads,  # ORT's intra-op pool: the job's share of the cores
        variant=lambda wc: PLAN.variant_of_compile(wc.key).to_json(),
        backend=PLAN.config["backend"],
    script:
        "../scripts/compile_variant.py"


rule compile:
    input:
        [PLAN.compile_dir(v) / "compile.json" for v in VARIANTS],
