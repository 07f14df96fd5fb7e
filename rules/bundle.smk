rule bundle_compare:
    input:
        reference_dumps=PLAN.dumps_of(REFERENCE),
        candidate_dumps=PLAN.dumps_of(CANDIDATE),
        reference_graph=PLAN.graph_json(REFERENCE),
        candidate_graph=PLAN.graph_json(CANDIDATE),
        local_errors=PLAN.local_errors_json("fusion"),
        report_json=PLAN.compare_dir() / "report.json",
    output:
        bundle=PLAN.bundle_dir() / "compare_bundle.tar.gz",
    log:
        PLAN.bundle_dir() / "bundle.log",
    benchmark:
        PLAN.bundle_dir() / "bundle.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["bundle"]["mem_mb"],
        runtime=RESOURCES["bundle"]["runtime"],
    params:
        golden=PLAN.golden_files,
        samples=PLAN.sample_names,
        output_names=list(PLAN.output_names),
        config=PLAN.config,
        model_sha256=PLAN.model_sha256,
        model_data_sha256=list(PLAN.inputs.data_sha256),
    script:
        "../scripts/make_bundle.py"


rule publish_bundle:
    input:
        bundle=rules.bundle_compare.output.bundle,
    output:
        published=published_dir(RESULTS, "bundle") / PUBLISHED,
        published_bundle=update(published_dir(RESULTS, "bundle") / "compare_bundle.tar.gz"),
    log:
        PLAN.bundle_dir() / "publish.log",
    benchmark:
        PLAN.bundle_dir() / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule bundle:
    input:
        rules.publish_bundle.output,


localrules:
    publish_bundle,
    bundle,
