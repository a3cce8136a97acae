"""The metrics record a trainer reports, as a typed record serialised to JSON.

The daemon carries the record from the trainer to the allocator, which rebuilds the
trainer's goodput model from it (:meth:`MetricsRecord.goodput_model`) and asks that
model for its curve. The record holds everything the model needs (fitted step-time
parameters, gradient statistics, batch limits, replicas per node) and the step
statistics a human wants to see. ``schema`` versions the layout: a reader refuses a
record from a newer writer rather than misreading it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from bftrainer.trainers.efficiency import pgns_from_stats
from bftrainer.trainers.goodput import BatchLimits, BatchLimitsError, GoodputModel
from bftrainer.trainers.throughput import ThroughputModel, ThroughputParams

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


class MetricsRecordError(ValueError):
    """A metrics record that cannot be read; names the field and where it came from."""


@dataclass(frozen=True)
class MetricsRecord:
    """One report of one trainer.

    ``nodes``/``local_bsz``/``accum_steps`` are the configuration it runs now;
    ``steps`` counts all observed steps, ``mean_step_time_s`` is the mean at the current
    configuration (None before its first counted step); ``progress`` is in base-batch
    steps (sum of AdaScale gains). ``grad_sqr``/``grad_var`` are per-sample, see
    :mod:`bftrainer.trainers.gns`; ``throughput`` is None before the first fit.
    """

    trainer_id: str
    time_s: float
    limits: BatchLimits
    replicas_per_node: int
    nodes: int
    local_bsz: int
    accum_steps: int
    steps: int
    mean_step_time_s: float | None
    configs_seen: int
    progress: float
    grad_sqr: float | None
    grad_var: float | None
    throughput: ThroughputModel | None
    lr_rule: str
    lr_factor: float
    schema: int = SCHEMA_VERSION

    @property
    def pgns(self) -> float | None:
        """phi = grad_var / grad_sqr (inf when grad_sqr is 0), None when not measured."""
        if self.grad_sqr is None or self.grad_var is None:
            return None
        return pgns_from_stats(self.grad_sqr, self.grad_var)

    @property
    def batch_size(self) -> int:
        """The total batch M of the current configuration."""
        return self.nodes * self.replicas_per_node * self.local_bsz * (self.accum_steps + 1)

    def goodput_model(self) -> GoodputModel:
        """The trainer's goodput model, for the allocator; needs a fitted throughput."""
        if self.throughput is None:
            raise MetricsRecordError(
                f"trainer {self.trainer_id!r}: no fitted throughput model in the record yet"
            )
        return GoodputModel(
            self.throughput, self.pgns, self.limits, replicas_per_node=self.replicas_per_node
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> MetricsRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise MetricsRecordError(f"{source}:{e.lineno}: not JSON: {e.msg}") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> MetricsRecord:
        r = _Reader(data, source)
        schema = r.integer("schema", minimum=1)
        if schema > SCHEMA_VERSION:
            raise MetricsRecordError(
                f"{source}: schema {schema} is newer than this reader's {SCHEMA_VERSION}"
            )
        limits_r = r.sub("limits")
        try:
            limits = BatchLimits(
                base_batch_size=limits_r.integer("base_batch_size", minimum=1),
                max_batch_size=limits_r.integer("max_batch_size", minimum=1),
                max_local_bsz=limits_r.integer("max_local_bsz", minimum=1),
                min_local_bsz=limits_r.integer("min_local_bsz", minimum=1),
                max_accum_steps=limits_r.integer("max_accum_steps", minimum=0),
            )
        except BatchLimitsError as e:
            raise MetricsRecordError(f"{source}: limits: {e}") from None
        throughput = None
        if r.data.get("throughput") is not None:
            t = r.sub("throughput")
            p = t.sub("params")
            try:
                params = ThroughputParams(
                    **{f.name: p.number(f.name, minimum=0.0) for f in fields(ThroughputParams)}
                )
            except ValueError as e:
                raise MetricsRecordError(f"{source}: throughput.params: {e}") from None
            throughput = ThroughputModel(
                params=params,
                rmsle=t.number("rmsle", minimum=0.0),
                observations=t.integer("observations", minimum=1),
                max_nodes_seen=t.integer("max_nodes_seen", minimum=1),
                max_replicas_seen=t.integer("max_replicas_seen", minimum=1),
            )
        return cls(
            trainer_id=r.text("trainer_id"),
            time_s=r.number("time_s"),
            limits=limits,
            replicas_per_node=r.integer("replicas_per_node", minimum=1),
            nodes=r.integer("nodes", minimum=1),
            local_bsz=r.integer("local_bsz", minimum=1),
            accum_steps=r.integer("accum_steps", minimum=0),
            steps=r.integer("steps", minimum=0),
            mean_step_time_s=r.optional_number("mean_step_time_s", minimum=0.0),
            configs_seen=r.integer("configs_seen", minimum=0),
            progress=r.number("progress", minimum=0.0),
            grad_sqr=r.optional_number("grad_sqr", minimum=0.0),
            grad_var=r.optional_number("grad_var", minimum=0.0),
            throughput=throughput,
            lr_rule=r.text("lr_rule"),
            lr_factor=r.number("lr_factor", minimum=0.0),
            schema=schema,
        )


class _Reader:
    """Typed access to a JSON object; every error names the dotted field and source."""

    def __init__(self, data: Any, source: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            what = prefix.rstrip(".") or "record"
            raise MetricsRecordError(f"{source}: {what} must be an object, got {data!r}")
        self.data: dict[str, Any] = data
        self.source = source
        self.prefix = prefix

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise MetricsRecordError(f"{self.source}: missing field {self.prefix}{key}")
        return self.data[key]

    def _fail(self, key: str, value: Any, want: str) -> MetricsRecordError:
        return MetricsRecordError(f"{self.source}: {self.prefix}{key} is {value!r}, {want}")

    def sub(self, key: str) -> _Reader:
        return _Reader(self._get(key), self.source, f"{self.prefix}{key}.")

    def text(self, key: str) -> str:
        v = self._get(key)
        if not isinstance(v, str) or not v:
            raise self._fail(key, v, "expected a non-empty string")
        return v

    def integer(self, key: str, minimum: int) -> int:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._fail(key, v, f"expected an integer >= {minimum}")
        return v

    def number(self, key: str, minimum: float | None = None) -> float:
        v = self._get(key)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (minimum is not None and v < minimum):
            bound = "" if minimum is None else f" >= {minimum:g}"
            raise self._fail(key, v, f"expected a finite number{bound}")
        return float(v)

    def optional_number(self, key: str, minimum: float | None = None) -> float | None:
        return None if self._get(key) is None else self.number(key, minimum)
