rule compare_dumps:
    input:
        unpack(lambda wc: PLAN.compare_inputs(wc.key)),
    output:
        report_json=stage_dir(WS, "compare") / "report.json",
        report_csv=stage_dir(WS, "compare") / "report.csv",
        report_html=stage_dir(WS, "compare") / "report.html",
        node_data=stage_dir(WS, "compare") / "node_data.json",
        summary=stage_dir(WS, "compare") / "summary.txt",
    log:
        stage_dir(WS, "compare") / "compare.log",
    benchmark:
        stage_dir(WS, "compare") / "compare.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["compare"]["mem_mb"],
        runtime=RESOURCES["compare"]["runtime"],
    params:
        golden=PLAN.golden_files,
        samples=PLAN.sample_names,
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        low_precision=lambda wc: PLAN.comparisons[wc.key].low_precision,
        labels=lambda wc: list(PLAN.comparisons[wc.key].labels),
        context=lambda wc: compare_context(CONTEXT, PLAN.comparisons[wc.key].name),
    script:
        "../scripts/compare_dumps.py"


rule fusion_local_errors:
    input:
        compiled_model=PLAN.compile_dir(CANDIDATE) / "model.onnx",
        reference_dumps=PLAN.dumps_of(REFERENCE),
        sample_inputs=PLAN.sample_inputs,
    output:
        local_json=PLAN.local_errors_json("fusion"),
    log:
        PLAN.local_errors_json("fusion").with_suffix(".log"),
    benchmark:
        PLAN.local_errors_json("fusion").with_suffix(".benchmark.tsv")
    threads: 1
    resources:
        mem_mb=RESOURCES["local"]["mem_mb"],
        runtime=RESOURCES["local"]["runtime"],
        gpu=RESOURCES["local"]["gpu"],
    params:
        threads=lambda wildcards, threads: threads,  # ORT's intra-op pool: the job's share of the cores
        backend=PLAN.config["backend"],
    script:
        "../scripts/local_errors.py"


rule publish_compare:
    input:
        report_json=PLAN.compare_dir() / "report.json",
        report_csv=PLAN.compare_dir() / "report.csv",
        report_html=PLAN.compare_dir() / "report.html",
        node_data=PLAN.compare_dir() / "node_data.json",
        summary=PLAN.compare_dir() / "summary.txt",
    output:
        published=published_dir(RESULTS, "compare") / PUBLISHED,
        published_report_json=update(published_dir(RESULTS, "compare") / "report.json"),
        published_report_csv=update(published_dir(RESULTS, "compare") / "report.csv"),
        published_report_html=update(published_dir(RESULTS, "compare") / "report.html"),
        published_node_data=update(published_dir(RESULTS, "compare") / "node_data.json"),
        published_summary=update(published_dir(RESULTS, "compare") / "summary.txt"),
    log:
        PLAN.compare_dir() / "publish.log",
    benchmark:
        PLAN.compare_dir() / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule compare:
    input:
        rules.publish_compare.output,


localrules:
    compile,
    graph,
    dump,
    compare,
    publish_compare,
