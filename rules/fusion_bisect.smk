# One job runs the whole search, one writes the answer (bisection/jobs.py); the probes' verdicts are kept
# under workspace/probe/. The search and result rules are also precision_bisect.smk's, used again there with
# its own files (`use rule ... with:`); the `bisection` param names the kind (bisection/jobs.py). A directive
# whose path names this bisection (log:, benchmark:) needs its own path in each `use rule ... with:` too.
BISECT = PLAN.bisect_dir()


rule fusion_search:
    input:
        model=PLAN.model,
        compile_record=PLAN.compile_dir(CANDIDATE) / "compile.json",
        compiled_model=PLAN.compile_dir(CANDIDATE) / "model.onnx",
        compare_report=PLAN.compare_dir() / "report.json",
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        search_json=BISECT / "search.json",
    log:
        BISECT / "search.log",
    benchmark:
        BISECT / "search.benchmark.tsv"
    threads: PLAN.config["bisect"]["parallel"]
    resources:
        mem_mb=RESOURCES["search"]["mem_mb"],
        runtime=RESOURCES["search"]["runtime"],
        gpu=RESOURCES["search"]["gpu"],
    params:
        bisection="fusion",
        verdicts=PLAN.verdict_store("fusion").to_json(),
        bisect=PLAN.config["bisect"],
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        backend=PLAN.config["backend"],
        threads=lambda wildcards, threads: threads,
    script:
        "../scripts/search.py"


rule fusion_result:
    input:
        search_json=BISECT / "search.json",
        compare_report=PLAN.compare_dir() / "report.json",
        compile_record=PLAN.compile_dir(CANDIDATE) / "compile.json",
        instances_json=BISECT / "instances.json",
        hybrid=BISECT / "hybrid.onnx",
    output:
        result_json=BISECT / "result.json",
        fusion_switch=BISECT / "fusion_switch.cfg",
        report_html=BISECT / "report.html",
        summary=BISECT / "summary.txt",
    log:
        BISECT / "result.log",
    benchmark:
        BISECT / "result.benchmark.tsv"
    params:
        bisection="fusion",
        context=CONTEXT,
    script:
        "../scripts/write_result.py"


# Which instances (fused nodes) of the culprit rules break accuracy: hybrids of the saved fusion-on graph with
# chosen instances reverted to their original nodes, searched like the rules (bisection/instances.py); the
# probes' verdicts are kept under workspace/instance_probe/. fusion_result runs after it: the bisect page and
# summary show the instance answer. A rule search with no answer gives no culprit rules to search here; the
# result job then says why, in one line.
rule fusion_instances:
    input:
        model=PLAN.model,
        compiled_model=PLAN.compile_dir(CANDIDATE) / "model.onnx",
        compile_record=PLAN.compile_dir(CANDIDATE) / "compile.json",
        graph_json=PLAN.graph_json(CANDIDATE),
        local_errors=PLAN.local_errors_json("fusion"),
        compare_report=PLAN.compare_dir() / "report.json",
        search_json=BISECT / "search.json",
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        instances_json=BISECT / "instances.json",
        hybrid=BISECT / "hybrid.onnx",
        hybrid_data=BISECT / "hybrid.onnx.data",
        instances_txt=BISECT / "instances.txt",
    log:
        BISECT / "instances.log",
    benchmark:
        BISECT / "instances.benchmark.tsv"
    threads: PLAN.config["bisect"]["parallel"]
    resources:
        mem_mb=RESOURCES["search"]["mem_mb"],
        runtime=RESOURCES["search"]["runtime"],
        gpu=RESOURCES["search"]["gpu"],
    params:
        verdicts=PLAN.instance_store().to_json(),
        bisect=PLAN.config["bisect"],
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        backend=PLAN.config["backend"],
        context=LINE_CONTEXT,
        threads=lambda wildcards, threads: threads,
    script:
        "../scripts/instances.py"


# The answer is published once every file of it exists, all together (formats/published.py): a run that
# fails before leaves the previous answer whole. Also precision_bisect.smk's, used again with its files.
rule publish_fusion_bisect:
    input:
        result_json=BISECT / "result.json",
        fusion_switch=BISECT / "fusion_switch.cfg",
        report_html=BISECT / "report.html",
        summary=BISECT / "summary.txt",
        instances_json=BISECT / "instances.json",
        hybrid=BISECT / "hybrid.onnx",
        hybrid_data=BISECT / "hybrid.onnx.data",
        instances_txt=BISECT / "instances.txt",
    output:
        published=published_dir(RESULTS, "fusion_bisect") / PUBLISHED,
        published_result_json=update(published_dir(RESULTS, "fusion_bisect") / "result.json"),
        published_fusion_switch=update(published_dir(RESULTS, "fusion_bisect") / "fusion_switch.cfg"),
        published_report_html=update(published_dir(RESULTS, "fusion_bisect") / "report.html"),
        published_summary=update(published_dir(RESULTS, "fusion_bisect") / "summary.txt"),
        published_instances_json=update(published_dir(RESULTS, "fusion_bisect") / "instances.json"),
        published_hybrid=update(published_dir(RESULTS, "fusion_bisect") / "hybrid.onnx"),
        published_hybrid_data=update(published_dir(RESULTS, "fusion_bisect") / "hybrid.onnx.data"),
        published_instances_txt=update(published_dir(RESULTS, "fusion_bisect") / "instances.txt"),
    log:
        BISECT / "publish.log",
    benchmark:
        BISECT / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule fusion_bisect:
    input:
        rules.publish_compare.output,
        rules.publish_fusion_bisect.output,


localrules:
    fusion_result,
    publish_fusion_bisect,
    fusion_bisect,
