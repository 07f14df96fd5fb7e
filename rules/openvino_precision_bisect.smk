# precision_bisect on backend openvino-cpu: one job searches the executed nodes to keep in f32 (IR `precise`
# marks, each probe read back) and writes the answer, the IR with its marks judged again from its files
# (bisection/openvino_precision.py); a second publishes it. The probes' verdicts are kept under
# workspace/precision_probe/, as the ORT search keeps its own.
OPENVINO_BISECT = PLAN.bisect_dir("precision")


rule openvino_precision_bisect:
    input:
        model=PLAN.model,
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        result_json=OPENVINO_BISECT / "result.json",
        keep_dtype=OPENVINO_BISECT / "keep_dtype.txt",
        ir_xml=OPENVINO_BISECT / "model.xml",
        ir_bin=OPENVINO_BISECT / "model.bin",
        summary=OPENVINO_BISECT / "summary.txt",
    log:
        OPENVINO_BISECT / "search.log",
    benchmark:
        OPENVINO_BISECT / "search.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["probe"]["mem_mb"],
        runtime=RESOURCES["search"]["runtime"],
    params:
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        dtype=PLAN.config["precision"]["dtype"],
        threads=lambda wildcards, threads: threads,
        verdicts=PLAN.openvino_store("precision").to_json(),
        context=LINE_CONTEXT,
    script:
        "../scripts/openvino_precision.py"


rule publish_precision_bisect:
    input:
        result_json=OPENVINO_BISECT / "result.json",
        keep_dtype=OPENVINO_BISECT / "keep_dtype.txt",
        ir_xml=OPENVINO_BISECT / "model.xml",
        ir_bin=OPENVINO_BISECT / "model.bin",
        summary=OPENVINO_BISECT / "summary.txt",
    output:
        published=published_dir(RESULTS, "precision_bisect") / PUBLISHED,
        published_result_json=update(published_dir(RESULTS, "precision_bisect") / "result.json"),
        published_keep_dtype=update(published_dir(RESULTS, "precision_bisect") / "keep_dtype.txt"),
        published_ir_xml=update(published_dir(RESULTS, "precision_bisect") / "model.xml"),
        published_ir_bin=update(published_dir(RESULTS, "precision_bisect") / "model.bin"),
        published_summary=update(published_dir(RESULTS, "precision_bisect") / "summary.txt"),
    log:
        OPENVINO_BISECT / "publish.log",
    benchmark:
        OPENVINO_BISECT / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule precision_bisect:
    input:
        rules.publish_compare.output,
        rules.publish_precision_bisect.output,


localrules:
    publish_precision_bisect,
    precision_bisect,
