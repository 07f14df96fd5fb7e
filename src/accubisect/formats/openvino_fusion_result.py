"""deploy.json and result.json of fusion_bisect on `backend: openvino-cpu` (written by
`bisection/openvino_fusion.py`): the deployable answer (plugin properties and barrier outputs) and the search
that found it.

Versioned like every stage record, so an answer of another accubisect version is a one-line "delete ... and
rerun" error, never a KeyError. A model with nothing to fix has no instance search, so its result.json has no
`instances`, `deploy` or `verified`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accubisect.formats.files import write_json
from accubisect.formats.record import read_record

OPENVINO_DEPLOY_FORMAT = 1
OPENVINO_FUSION_FORMAT = 1


@dataclass(frozen=True)
class OpenVinoDeploy:
    """deploy.json: what a user compiles with to deploy the answer."""

    properties: Mapping[str, str]  # CPU plugin properties, e.g. {"SNIPPETS_MODE": "DISABLE"}
    barrier_outputs: tuple[str, ...]  # tensors to add as outputs, each breaking the fused node it lies in

    def to_json(self) -> dict[str, Any]:
        return {"format": OPENVINO_DEPLOY_FORMAT, "properties": dict(self.properties),
                "barrier_outputs": list(self.barrier_outputs)}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> OpenVinoDeploy:
        """The answer from its JSON: deploy.json's, or result.json's `deploy`."""
        return cls(dict(data["properties"]), tuple(data["barrier_outputs"]))

    @classmethod
    def read(cls, path: str | Path) -> OpenVinoDeploy:
        return read_record(path, "OpenVINO deployable answer", OPENVINO_DEPLOY_FORMAT, cls.of)


@dataclass(frozen=True)
class OpenVinoFusionResult:
    """result.json: the rule- and instance-level search and its answer, judged again."""

    status: str  # nothing to fix | fixed | not switchable (an answer failing compiled again stops the job)
    switches_off: tuple[str, ...]  # the switches the answer sets off
    barriers: Mapping[str, str]  # fused node -> its barrier tensor
    instances: tuple[Mapping[str, Any], ...] | None  # every fused node: name, type, layers, barrier
    deploy: OpenVinoDeploy | None  # the answer, as deploy.json holds it
    verified: Mapping[str, bool | None] | None  # each answer (switches, barriers) compiled again and judged
    probes: tuple[Mapping[str, Any], ...]  # every probe, in order
    seconds: float

    def to_json(self) -> dict[str, Any]:
        searched = {} if self.instances is None else {
            "instances": list(self.instances), "deploy": self.deploy.to_json() if self.deploy else None,
            "verified": dict(self.verified or {})}
        return {"format": OPENVINO_FUSION_FORMAT, "backend": "openvino-cpu", "status": self.status,
                "switches_off": list(self.switches_off), "barriers": dict(self.barriers), **searched,
                "probes": list(self.probes), "seconds": self.seconds}

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: str | Path) -> OpenVinoFusionResult:
        return read_record(path, "OpenVINO fusion_bisect result", OPENVINO_FUSION_FORMAT, lambda d: cls(
            d["status"], tuple(d["switches_off"]), dict(d["barriers"]),
            tuple(d["instances"]) if "instances" in d else None,
            OpenVinoDeploy.of(d["deploy"]) if d.get("deploy") else None, d.get("verified"), tuple(d["probes"]),
            d["seconds"]))
