rule assign_precision:
    input:
        compiled_model=PLAN.compile_dir(PLAN.precision_base) / "model.onnx",
        graph_json=PLAN.graph_json(PLAN.precision_base),
        sample_inputs=PLAN.samples[0].inputs,
    output:
        assignment=PLAN.precision_dir() / "assignment.json",
        reduced_model=PLAN.precision_dir() / "model.onnx",
    log:
        PLAN.precision_dir() / "assignment.log",
    benchmark:
        PLAN.precision_dir() / "assignment.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["dump"]["mem_mb"],
        runtime=RESOURCES["dump"]["runtime"],
        gpu=RESOURCES["dump"]["gpu"],
    params:
        threads=lambda wildcards, threads: threads,  # ORT's intra-op pool: the job's share of the cores
        precision=PLAN.config["precision"],
        backend=PLAN.config["backend"],
    script:
        "../scripts/assign_precision.py"


rule local_errors:
    input:
        compiled_model=PLAN.compile_dir(PLAN.precision_base) / "model.onnx",
        assignment=PLAN.precision_dir() / "assignment.json",
        reference_dumps=PLAN.dumps_of(PLAN.precision_base),
        sample_inputs=PLAN.sample_inputs,
    output:
        local_json=PLAN.precision_dir() / "local.json",
    log:
        PLAN.precision_dir() / "local.log",
    benchmark:
        PLAN.precision_dir() / "local.benchmark.tsv"
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


rule publish_precision:
    input:
        assignment=PLAN.precision_dir() / "assignment.json",
        report_json=PLAN.compare_dir("precision") / "report.json",
        report_csv=PLAN.compare_dir("precision") / "report.csv",
        report_html=PLAN.compare_dir("precision") / "report.html",
        summary=PLAN.compare_dir("precision") / "summary.txt",
        node_data=PLAN.compare_dir("precision") / "node_data.json",
    output:
        published=published_dir(RESULTS, "precision") / PUBLISHED,
        published_assignment=update(published_dir(RESULTS, "precision") / "assignment.json"),
        published_report_json=update(published_dir(RESULTS, "precision") / "report.json"),
        published_report_csv=update(published_dir(RESULTS, "precision") / "report.csv"),
        published_report_html=update(published_dir(RESULTS, "precision") / "report.html"),
        published_summary=update(published_dir(RESULTS, "precision") / "summary.txt"),
        published_node_data=update(published_dir(RESULTS, "precision") / "node_data.json"),
    log:
        PLAN.compare_dir("precision") / "publish.log",
    benchmark:
        PLAN.compare_dir("precision") / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule precision:
    input:
        rules.publish_precision.output,


localrules:
    publish_precision,
    precision,
