rule dump_sample:
    input:
        model=PLAN.model,
        compiled_model=lambda wc: PLAN.dumps[wc.key].model,
        compile_record=lambda wc: PLAN.dumps[wc.key].compile_record,
        sample_inputs=lambda wc: PLAN.dumps[wc.key].sample.inputs,
        compared_with=lambda wc: PLAN.compared_with(wc.key),
    output:
        dump=stage_dir(WS, "dump") / "dump.h5",
    log:
        stage_dir(WS, "dump") / "dump.log",
    benchmark:
        stage_dir(WS, "dump") / "dump.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["dump"]["mem_mb"],
        runtime=RESOURCES["dump"]["runtime"],
        gpu=RESOURCES["dump"]["gpu"],
    params:
        threads=lambda wildcards, threads: threads,  # ORT's intra-op pool: the job's share of the cores
        variant=lambda wc: PLAN.dumps[wc.key].variant,
        sample=lambda wc: PLAN.dumps[wc.key].sample.name,
        backend=PLAN.config["backend"],
        dump_options=dump_options(PLAN.config),
    script:
        "../scripts/dump_sample.py"


rule dump:
    input:
        [path for v in VARIANTS for path in PLAN.dumps_of(v)],
