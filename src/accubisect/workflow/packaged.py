"""The workflow the installed package carries, and the `snakemake` command line that runs it in the user's own
folder (`accubisect run`).

The wheel holds the Snakefile, rules, scripts and profiles under accubisect/data/workflow. In the repository that
folder holds links to the checkout's own files (one copy of each in git, where `snakemake` in the checkout finds
them), so an editable install and the wheel find the workflow at the same place. Snakemake resolves the rules'
`script:` paths from the Snakefile it is given, and reads `profiles/default` beside it as the workflow profile
(`rerun-incomplete`) when the user's folder has none of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accubisect.core.errors import ConfigError, UsageError

WORKFLOW = Path(__file__).resolve().parent.parent / "data" / "workflow"
SNAKEFILE = WORKFLOW / "Snakefile"
PROFILES = WORKFLOW / "profiles"
PROJECT_CONFIG = Path("config.yaml")  # what `accubisect init` writes and `accubisect run` reads by default
LOCAL = "local"  # every core of this machine; `slurm` sends each job to SLURM
CONFIG_FLAGS = ("--config", "-C")


@dataclass(frozen=True)
class RunRequest:
    """What `accubisect run` was asked: a target, the model and samples or a config file, a profile, and
    whatever else goes to snakemake as it is."""

    target: str
    model: str | None = None
    samples: str | None = None
    configfile: Path | None = None
    profile: str = LOCAL
    snakemake_args: tuple[str, ...] = ()


def packaged_profiles() -> list[str]:
    """The profiles one may name; `default` is not among them: Snakemake reads it on every run."""
    return sorted(path.name for path in PROFILES.iterdir() if (path / "config.yaml").is_file() and
                  path.name != "default")


def profile_folder(name: str) -> Path:
    """A profile the package carries (`local`, `slurm`), or the user's own profile folder."""
    if name in packaged_profiles():
        return PROFILES / name
    if Path(name).is_dir():
        return Path(name)
    raise UsageError(f"--profile {name}: neither a profile accubisect carries ({', '.join(packaged_profiles())}) "
                     "nor a folder; give one of those or your profile's folder")


def project_configfile(given: Path | None) -> Path | None:
    """The config file the run reads: the one given, else the folder's config.yaml (`accubisect init`'s) where
    there is one. Checked here because snakemake answers a missing --configfile with a traceback."""
    if given is None:
        return PROJECT_CONFIG if PROJECT_CONFIG.is_file() else None
    if not given.is_file():
        raise ConfigError(f"--configfile {given}: no such file; give your project's config file, or write one with "
                          "`accubisect init`")
    return given


def snakemake_command(request: RunRequest, python: str = sys.executable) -> list[str]:
    """`python -m snakemake` on the packaged Snakefile, run in the current folder. The target and the user's
    arguments (more targets among them) come first and options taking several values (`--configfile`,
    `--config`) last, where they can swallow no target; `--model`/`--samples` are `--config` items, joined to
    the user's own `--config` where they gave one."""
    configfile = project_configfile(request.configfile)
    items = [f"{key}={value}" for key, value in (("model", request.model), ("samples", request.samples)) if value]
    if configfile is None and not items and not set(CONFIG_FLAGS) & set(request.snakemake_args):
        raise ConfigError("no model configured: pass --model MODEL --samples FOLDER, or --configfile FILE, or "
                          "write config.yaml here with `accubisect init` and set its model and samples")
    arguments, joined = _with_config(list(request.snakemake_args), items)
    command = [python, "-m", "snakemake", request.target, *arguments, "--snakefile", str(SNAKEFILE),
               "--profile", str(profile_folder(request.profile))]
    if configfile is not None:
        command += ["--configfile", str(configfile)]
    return command if joined or not items else [*command, "--config", *items]


def _with_config(arguments: list[str], items: Sequence[str]) -> tuple[list[str], bool]:
    """Snakemake keeps only the last `--config`: the items go into the user's own where there is one (and
    whether they did)."""
    for flag in CONFIG_FLAGS:
        if flag in arguments:
            at = arguments.index(flag) + 1
            return [*arguments[:at], *items, *arguments[at:]], True
    return arguments, False
