rule map_graph:
    input:
        model=PLAN.model,
        compiled_model=lambda wc: PLAN.compile_dir(PLAN.variant_of_graph(wc.key)) / "model.onnx",
        compile_record=lambda wc: PLAN.compile_dir(PLAN.variant_of_graph(wc.key)) / "compile.json",
    output:
        graph_json=stage_dir(WS, "graph") / "graph.json",
    log:
        stage_dir(WS, "graph") / "graph.log",
    benchmark:
        stage_dir(WS, "graph") / "graph.benchmark.tsv"
    threads: 1
    resources:
        mem_mb=RESOURCES["graph"]["mem_mb"],
        runtime=RESOURCES["graph"]["runtime"],
        gpu=RESOURCES["graph"]["gpu"],
    params:
        threads=lambda wildcards, threads: threads,  # ORT's intra-op pool: the job's share of the cores
    script:
        "../scripts/map_graph.py"


rule graph:
    input:
        [PLAN.graph_json(v) for v in VARIANTS],
