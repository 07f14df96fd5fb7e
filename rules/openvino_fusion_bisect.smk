# fusion_bisect on backend openvino-cpu: one job searches what OpenVINO can switch (snippets at rule level,
# a barrier output per fused node at instance level) against fusion off and judges its answer compiled
# again (bisection/openvino_fusion.py); a second publishes it. The probes' verdicts are kept under
# workspace/probe/ (rule level) and workspace/instance_probe/ (instance level), as the ORT searches keep theirs.
OPENVINO_FUSION = PLAN.bisect_dir()


rule openvino_fusion_bisect:
    input:
        model=PLAN.model,
        sample_inputs=PLAN.sample_inputs,
    output:
        result_json=OPENVINO_FUSION / "result.json",
        deploy_json=OPENVINO_FUSION / "deploy.json",
        summary=OPENVINO_FUSION / "summary.txt",
    log:
        OPENVINO_FUSION / "search.log",
    benchmark:
        OPENVINO_FUSION / "search.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["probe"]["mem_mb"],
        runtime=RESOURCES["search"]["runtime"],
    params:
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        threads=lambda wildcards, threads: threads,
        verdicts=PLAN.openvino_store("rule").to_json(),
        instance_verdicts=PLAN.openvino_store("instance").to_json(),
        context=LINE_CONTEXT,
    script:
        "../scripts/openvino_fusion.py"


rule publish_fusion_bisect:
    input:
        result_json=OPENVINO_FUSION / "result.json",
        deploy_json=OPENVINO_FUSION / "deploy.json",
        summary=OPENVINO_FUSION / "summary.txt",
    output:
        published=published_dir(RESULTS, "fusion_bisect") / PUBLISHED,
        published_result_json=update(published_dir(RESULTS, "fusion_bisect") / "result.json"),
        published_deploy_json=update(published_dir(RESULTS, "fusion_bisect") / "deploy.json"),
        published_summary=update(published_dir(RESULTS, "fusion_bisect") / "summary.txt"),
    log:
        OPENVINO_FUSION / "publish.log",
    benchmark:
        OPENVINO_FUSION / "publish.benchmark.tsv"
    script:
        "../scripts/publish.py"


rule fusion_bisect:
    input:
        rules.publish_compare.output,
        rules.publish_fusion_bisect.output,


localrules:
    publish_fusion_bisect,
    fusion_bisect,
