"""Where the workflow's files live: the path scheme, spelled here once.

    <workspace>/<stage>/<key>/<file>   a stage's files; the key is a hash of what determines them
                                       (workflow/plan.py derives every key, formats/digest.py hashes)
    <workspace>/<stage>/<key>/verdict.json   one probe's verdict; the key hashes the search's inputs and the
                                       configuration (formats/verdict.VerdictStore)
    <workspace>/.digests.json          file digests memoised across parses (formats/digest.DigestCache)
    <results>/<target>/<file>          what a target publishes: copies of the stage files that answer it
    <results>/<target>/published.json  which files the target published, together (formats/published.py)

The plan (workflow/plan.py), pruning (workflow/workspace.py) and the rules (rules/*.smk) build their paths
with these functions; a rule's output names its key with the wildcard `KEY`. Here, below the stages, so that
any layer may use it; it touches no file.
"""

from __future__ import annotations

from pathlib import Path

from accubisect.formats.digest import KEY_LENGTH

# Every stage folder a workflow writes; pruning looks in these and only these.
STAGES = ("compile", "graph", "dump", "compare", "local", "probe", "fusion_bisect", "instance_probe", "bundle",
          "precision", "precision_probe", "precision_bisect", "reduce", "reduce_probe")
KEY = "{key}"  # a rule's wildcard for a stage key
KEY_PATTERN = f"[0-9a-f]{{{KEY_LENGTH}}}"  # what the wildcard matches (rules/common.smk)
DIGESTS = ".digests.json"
PUBLISHED = "published.json"
VERDICT = "verdict.json"


def stage_root(workspace: Path | str, stage: str) -> Path:
    """The folder holding every key of one stage."""
    if stage not in STAGES:
        raise ValueError(f"{stage!r} is no workspace stage; the stages are {', '.join(STAGES)}")
    return Path(workspace) / stage


def stage_dir(workspace: Path | str, stage: str, key: str = KEY) -> Path:
    """One stage folder: `<workspace>/<stage>/<key>`, or with no key the pattern a rule's output names."""
    return stage_root(workspace, stage) / key


def verdict_file(root: Path | str, key: str) -> Path:
    """One probe's verdict: `<root>/<verdict key>/verdict.json`, `root` a probe stage's folder (`stage_root`)."""
    return Path(root) / key / VERDICT


def published_dir(results: Path | str, target: str) -> Path:
    """Where a target publishes its answer files: `<results>/<target>`."""
    return Path(results) / target


def digests_file(workspace: Path | str) -> Path:
    return Path(workspace) / DIGESTS
