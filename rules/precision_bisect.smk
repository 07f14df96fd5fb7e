# The same search and result jobs as fusion_bisect (its rules, used again with this bisection's files); a
# probe keeps a set of nodes in fp32. Before searching, the job measures what the reduced type can reach at
# all (noise_floor.py).
PRECISION_BISECT = PLAN.bisect_dir("precision")


use rule fusion_search as precision_search with:
    input:
        compiled_model=PLAN.compile_dir(PLAN.precision_base) / "model.onnx",
        assignment=PLAN.precision_dir() / "assignment.json",
        compare_report=PLAN.compare_dir("precision") / "report.json",
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        search_json=PRECISION_BISECT / "search.json",
    log:
        PRECISION_BISECT / "search.log",
    benchmark:
        PRECISION_BISECT / "search.benchmark.tsv"
    params:
        bisection="precision",
        verdicts=PLAN.verdict_store("precision").to_json(),


# The answer settled in the deployable model, before the result is written: the search's answer carried to
# your model's nodes, verified there, made 1-minimal there or searched again there, each configuration judged
# as model.onnx and as keep_dtype.txt given to the compiler (bisection/deployable.py); its verdicts are kept
# beside the search's. The result job writes every answer file from it, so the summary, result.json, the page
# and model.onnx describe one answer.
rule precision_deploy:
    input:
        model=PLAN.model,
        compiled_model=PLAN.compile_dir(PLAN.precision_base) / "model.onnx",
        search_json=PRECISION_BISECT / "search.json",
        assignment=PLAN.precision_dir() / "assignment.json",
        graph_json=PLAN.graph_json(PLAN.precision_base),
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        deployed_json=PRECISION_BISECT / "deployed.json",
        finalized_model=PRECISION_BISECT / "model.onnx",
        finalized_data=PRECISION_BISECT / "model.onnx.data",
        finalize_json=PRECISION_BISECT / "finalize.json",
    log:
        PRECISION_BISECT / "deploy.log",
    benchmark:
        PRECISION_BISECT / "deploy.benchmark.tsv"
    threads: PLAN.config["bisect"]["parallel"]
    resources:
        mem_mb=RESOURCES["probe"]["mem_mb"],
        runtime=RESOURCES["probe"]["runtime"],
        gpu=RESOURCES["probe"]["gpu"],
    params:
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        backend=PLAN.config["backend"],
        variant=PLAN.variants[PLAN.precision_base].to_json(),
        verdicts=PLAN.verdict_store("deployable").to_json(),
        search_verdicts=PLAN.verdict_store("precision").to_json(),
        bisect=PLAN.config["bisect"],
        threads=lambda wildcards, threads: threads,
    script:
        "../scripts/deploy_precision.py"


use rule fusion_result as precision_result with:
    input:
        search_json=PRECISION_BISECT / "search.json",
        compare_report=PLAN.compare_dir("precision") / "report.json",
        assignment=PLAN.precision_dir() / "assignment.json",
        graph_json=PLAN.graph_json(PLAN.precision_base),
        deployed_json=PRECISION_BISECT / "deployed.json",
    output:
        result_json=PRECISION_BISECT / "result.json",
        keep_dtype=PRECISION_BISECT / "keep_dtype.txt",
        modify_mixlist=PRECISION_BISECT / "modify_mixlist.json",
        report_html=PRECISION_BISECT / "report.html",
        summary=PRECISION_BISECT / "summary.txt",
    log:
        PRECISION_BISECT / "result.log",
    benchmark:
        PRECISION_BISECT / "result.benchmark.tsv"
    params:
        bisection="precision",


use rule publish_fusion_bisect as publish_precision_bisect with:
    input:
        result_json=PRECISION_BISECT / "result.json",
        keep_dtype=PRECISION_BISECT / "keep_dtype.txt",
        modify_mixlist=PRECISION_BISECT / "modify_mixlist.json",
        report_html=PRECISION_BISECT / "report.html",
        summary=PRECISION_BISECT / "summary.txt",
        finalized_model=PRECISION_BISECT / "model.onnx",
        finalized_data=PRECISION_BISECT / "model.onnx.data",
        finalize_json=PRECISION_BISECT / "finalize.json",
    output:
        published=published_dir(RESULTS, "precision_bisect") / PUBLISHED,
        published_result_json=update(published_dir(RESULTS, "precision_bisect") / "result.json"),
        published_keep_dtype=update(published_dir(RESULTS, "precision_bisect") / "keep_dtype.txt"),
        published_modify_mixlist=update(published_dir(RESULTS, "precision_bisect") / "modify_mixlist.json"),
        published_report_html=update(published_dir(RESULTS, "precision_bisect") / "report.html"),
        published_summary=update(published_dir(RESULTS, "precision_bisect") / "summary.txt"),
        published_finalized_model=update(published_dir(RESULTS, "precision_bisect") / "model.onnx"),
        published_finalized_data=update(published_dir(RESULTS, "precision_bisect") / "model.onnx.data"),
        published_finalize_json=update(published_dir(RESULTS, "precision_bisect") / "finalize.json"),
    log:
        PRECISION_BISECT / "publish.log",
    benchmark:
        PRECISION_BISECT / "publish.benchmark.tsv"


rule precision_bisect:
    input:
        rules.publish_precision.output,
        rules.publish_precision_bisect.output,


localrules:
    precision_result,
    publish_precision_bisect,
    precision_bisect,
