"""The metrics record: JSON round trip, and errors that name the field and the source."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bftrainer.trainers.goodput import BatchLimits
from bftrainer.trainers.metrics import SCHEMA_VERSION, MetricsRecord, MetricsRecordError
from bftrainer.trainers.throughput import ThroughputModel, ThroughputParams

LIMITS = BatchLimits(base_batch_size=64, max_batch_size=4096, max_local_bsz=256)
MODEL = ThroughputModel(
    params=ThroughputParams(0.05, 0.002, 0.0, 0.0, 0.1, 0.01, 2.0),
    rmsle=0.03,
    observations=5,
    max_nodes_seen=4,
    max_replicas_seen=4,
)


def record(**kw: Any) -> MetricsRecord:
    base: dict[str, Any] = {
        "trainer_id": "t1",
        "time_s": 1700000000.5,
        "limits": LIMITS,
        "replicas_per_node": 1,
        "nodes": 4,
        "local_bsz": 128,
        "accum_steps": 1,
        "steps": 120,
        "mean_step_time_s": 0.31,
        "configs_seen": 3,
        "progress": 250.5,
        "grad_sqr": 2.0,
        "grad_var": 1000.0,
        "throughput": MODEL,
        "lr_rule": "adascale",
        "lr_factor": 3.5,
    }
    base.update(kw)
    return MetricsRecord(**base)


def test_json_round_trip_is_exact() -> None:
    for r in (record(), record(throughput=None, grad_sqr=None, grad_var=None)):
        assert MetricsRecord.from_json(r.to_json()) == r


def test_derived_fields() -> None:
    r = record()
    assert r.pgns == pytest.approx(500.0)
    assert r.batch_size == 4 * 128 * 2
    assert record(grad_sqr=0.0).pgns == math.inf
    assert record(grad_sqr=None).pgns is None


def test_the_allocator_rebuilds_the_goodput_model_from_the_record() -> None:
    model = MetricsRecord.from_json(record().to_json()).goodput_model()
    assert model.pgns == pytest.approx(500.0)
    assert model.max_nodes_seen == 4
    curve = model.curve(1, 16)
    assert curve[0][0] == 1 and curve[-1][0] == 16
    with pytest.raises(MetricsRecordError, match="'t1': no fitted throughput"):
        record(throughput=None).goodput_model()


def mutate(path: list[str], value: Any) -> str:
    data = json.loads(record().to_json())
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (["nodes"], 0, "report.json: nodes is 0, expected an integer >= 1"),
        (["nodes"], True, "nodes is True"),
        (["progress"], KeyError, "missing field progress"),
        (["throughput", "params", "gamma"], 0.5, "throughput.params: gamma"),
        (["throughput", "rmsle"], "x", "throughput.rmsle is 'x'"),
        (["limits", "max_batch_size"], 8, "limits: max_batch_size 8 < base_batch_size 64"),
        (["grad_var"], -1.0, "grad_var is -1.0"),
        (["schema"], SCHEMA_VERSION + 1, "newer than this reader"),
        (["limits"], [], "limits must be an object"),
    ],
)
def test_bad_records_name_field_and_source(path: list[str], value: Any, match: str) -> None:
    with pytest.raises(MetricsRecordError, match=match):
        MetricsRecord.from_json(mutate(path, value), source="report.json")


def test_not_json_is_named() -> None:
    with pytest.raises(MetricsRecordError, match=r"report\.json:1: not JSON"):
        MetricsRecord.from_json("{oops", source="report.json")
