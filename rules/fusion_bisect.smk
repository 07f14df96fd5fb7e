# Rounds unfold through a checkpoint: round r's plan needs the verdicts of every earlier round's probes.
from accubisect.bisection import collect_rounds

BISECT = PLAN.bisect_dir()


def plan_of(round_index):
    return checkpoints.fusion_plan.get(round=round_index).output.plan


checkpoint fusion_plan:
    input:
        compile_record=PLAN.compile_dir(CANDIDATE) / "compile.json",
        compare_report=PLAN.compare_dir() / "report.json",
        verdicts=exit_on_error(
            lambda wc: PLAN.verdicts_of_rounds(plan_of(r) for r in range(int(wc.round)))
        ),
    output:
        plan=f"{BISECT}/round{{round}}/plan.json",
    params:
        round_index=lambda wc: int(wc.round),
        rules=PLAN.config["bisect"]["rules"],
        parallel=PLAN.config["bisect"]["parallel"],
        min_pass_fraction=PLAN.config["accuracy"]["min_pass_fraction"],
    log:
        f"{BISECT}/round{{round}}/plan.log",
    script:
        "../scripts/plan_round.py"


rule fusion_probe:
    input:
        model=PLAN.model,
        sample_inputs=PLAN.sample_inputs,
        references=PLAN.references(),
    output:
        verdict=f"{WS}/probe/{{key}}/verdict.json",
    params:
        off=exit_on_error(lambda wc: PLAN.probe_off(wc.key)),
        variant=exit_on_error(lambda wc: PLAN.probe_variant(PLAN.probe_off(wc.key)).to_json()),
        output_names=list(PLAN.output_names),
        accuracy=PLAN.config["accuracy"],
        backend=PLAN.config["backend"],
    threads: 1
    resources:
        mem_mb=RESOURCES["probe"]["mem_mb"],
        runtime=RESOURCES["probe"]["runtime"],
        gpu=RESOURCES["probe"]["gpu"],
    log:
        f"{WS}/probe/{{key}}/probe.log",
    benchmark:
        f"{WS}/probe/{{key}}/probe.benchmark.tsv"
    script:
        "../scripts/run_probe.py"


rule fusion_result:
    input:
        plans=exit_on_error(lambda wc: collect_rounds(plan_of)),
        verdicts=exit_on_error(lambda wc: PLAN.verdicts_of_rounds(collect_rounds(plan_of))),
        compare_report=PLAN.compare_dir() / "report.json",
        compile_record=PLAN.compile_dir(CANDIDATE) / "compile.json",
    output:
        result_json=f"{BISECT}/result.json",
        fusion_switch=f"{BISECT}/fusion_switch.cfg",
        report_html=f"{BISECT}/report.html",
        summary=f"{BISECT}/summary.txt",
    params:
        context=CONTEXT,
    log:
        f"{BISECT}/result.log",
    script:
        "../scripts/write_result.py"


rule publish_fusion_bisect:
    input:
        result_json=f"{BISECT}/result.json",
        fusion_switch=f"{BISECT}/fusion_switch.cfg",
        report_html=f"{BISECT}/report.html",
        summary=f"{BISECT}/summary.txt",
    output:
        published_result_json=f"{RESULTS}/fusion_bisect/result.json",
        published_fusion_switch=f"{RESULTS}/fusion_bisect/fusion_switch.cfg",
        published_report_html=f"{RESULTS}/fusion_bisect/report.html",
        published_summary=f"{RESULTS}/fusion_bisect/summary.txt",
    script:
        "../scripts/publish.py"


rule fusion_bisect:
    input:
        rules.publish_compare.output,
        rules.publish_fusion_bisect.output,


localrules:
    fusion_plan,
    fusion_result,
    publish_fusion_bisect,
    fusion_bisect,
