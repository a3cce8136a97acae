"""The per-step agent: observe steps and gradients, fit, choose batches, report metrics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bftrainer.trainers.agent import ConfigError, PolluxAgent
from bftrainer.trainers.efficiency import gain
from bftrainer.trainers.gns import GradientNoiseScale, adam_preconditioner, from_consecutive
from bftrainer.trainers.goodput import BatchLimits, GoodputModel
from bftrainer.trainers.metrics import MetricsRecord
from bftrainer.trainers.throughput import ThroughputParams, predict_step_time

TRUE = ThroughputParams(0.04, 0.001, 0.0, 0.0, 0.08, 0.004, 2.0)
LIMITS = BatchLimits(base_batch_size=32, max_batch_size=8192, max_local_bsz=512)
DIM = 50


def test_agent_learns_the_model_and_reports_it() -> None:
    rng = np.random.default_rng(0)
    g = rng.normal(size=DIM)
    var = rng.uniform(0.5, 1.5, size=DIM)
    var *= 400.0 * (g @ g) / var.sum()  # true PGNS 400 samples
    agent = PolluxAgent("job-1", LIMITS, clock=lambda: 123.0)
    for nodes, bsz in itertools.product([1, 2, 4], [32, 64, 128]):
        agent.set_config(nodes, bsz)
        for _ in range(40):
            t = float(predict_step_time(TRUE, nodes, nodes, bsz)) * float(
                np.exp(rng.normal(0, 0.02))
            )
            grads = g + rng.normal(size=(nodes, DIM)) * np.sqrt(var / bsz)
            agent.observe_gradients(list(grads))
            agent.observe_step(t)
    assert agent.pgns == pytest.approx(400.0, rel=0.15)
    record = agent.metrics()
    assert record.throughput is not None and record.throughput.rmsle < 0.05
    assert record.steps == 9 * 40 and record.configs_seen == 9
    assert (record.nodes, record.local_bsz, record.time_s) == (4, 128, 123.0)
    assert MetricsRecord.from_json(record.to_json()) == record
    # The learned model's choice is nearly as good as the true model's best.
    truth = GoodputModel(TRUE, 400.0, LIMITS)
    for n in (1, 4, 8):
        chosen = agent.best_config(n)
        assert chosen is not None
        true_value = truth.goodput(n, chosen.local_bsz, chosen.accum_steps)
        assert true_value >= 0.95 * truth.best_config(n).goodput_sps
    assert agent.lr_factor == pytest.approx(float(gain(4 * 128, 32, agent.pgns or 0.0)))


def test_warmup_steps_are_not_timed() -> None:
    agent = PolluxAgent("j", LIMITS, warmup_steps=2)
    agent.set_config(2, 64)
    for t in (9.0, 9.0, 1.0, 3.0):
        agent.observe_step(t)
    [obs] = agent.observations()
    assert obs.step_time_s == pytest.approx(2.0)
    assert agent.steps == 4
    agent.set_config(2, 64)  # a restart at the same configuration warms up again
    agent.observe_step(50.0)
    assert agent.observations()[0].step_time_s == pytest.approx(2.0)


def test_progress_counts_base_batch_steps() -> None:
    agent = PolluxAgent("j", LIMITS, warmup_steps=0)
    agent.set_config(1, 128)
    agent.observe_step(0.1)
    assert agent.progress == 1.0  # noise unknown: a step counts as one base step
    agent.gns.update_from_norms(local_sqr_mean=3.0, total_sqr=2.0, groups=2, group_bsz=16)
    phi = agent.pgns
    assert phi is not None
    agent.observe_step(0.1)
    assert agent.progress == pytest.approx(1.0 + float(gain(128, 32, phi)))


def test_no_model_before_timed_steps() -> None:
    agent = PolluxAgent("j", LIMITS)
    with pytest.raises(ConfigError, match="set_config"):
        agent.observe_step(0.1)
    agent.set_config(1, 32)
    agent.observe_step(0.1)  # warm-up only
    assert agent.fit() is None and agent.best_config(2) is None
    assert agent.metrics().throughput is None


@pytest.mark.parametrize(
    ("args", "match"), [((0, 32), "nodes"), ((1, 0), "local_bsz"), ((1, 32, -1), "accum_steps")]
)
def test_bad_configs_are_named(args: tuple[int, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PolluxAgent("j", LIMITS).set_config(*args)


def test_bad_step_time_is_named() -> None:
    agent = PolluxAgent("j", LIMITS)
    agent.set_config(1, 32)
    with pytest.raises(ConfigError, match="step_time_s"):
        agent.observe_step(float("nan"))


# -- torch probe ---------------------------------------------------------------


def _set_grads(model: object, flat: np.ndarray) -> None:
    import torch

    offset = 0
    for p in model.parameters():  # type: ignore[attr-defined]
        n = p.numel()
        p.grad = torch.tensor(flat[offset : offset + n], dtype=p.dtype).reshape(p.shape)
        offset += n


def test_torch_probe_matches_the_numpy_estimator() -> None:
    torch = pytest.importorskip("torch")
    from bftrainer.trainers.probe import TorchGradientProbe

    model = torch.nn.Linear(6, 3).double()
    agent = PolluxAgent("j", LIMITS)
    agent.set_config(1, 16)
    probe = TorchGradientProbe(agent, model, every=1)
    reference = GradientNoiseScale(LIMITS.base_batch_size)
    rng = np.random.default_rng(0)
    for _ in range(30):
        flat = rng.normal(size=21) + 0.5
        _set_grads(model, flat)
        probe.after_backward()
        reference.observe([flat], 16)
    assert agent.gns.samples == 0  # the estimates wait on the device for a flush
    probe.flush()
    assert agent.gns.samples == reference.samples == 29
    assert agent.gns.grad_sqr == pytest.approx(reference.grad_sqr)
    assert agent.gns.grad_var == pytest.approx(reference.grad_var)


def test_torch_probe_measures_one_pair_every_k_steps() -> None:
    torch = pytest.importorskip("torch")
    from bftrainer.trainers.probe import TorchGradientProbe

    model = torch.nn.Linear(3, 2).double()
    agent = PolluxAgent("j", LIMITS)
    agent.set_config(1, 16)
    probe = TorchGradientProbe(agent, model, every=4)
    reference = GradientNoiseScale(LIMITS.base_batch_size)
    rng = np.random.default_rng(2)
    flats = [rng.normal(size=8) + 1.0 for _ in range(12)]
    for i, flat in enumerate(flats):
        _set_grads(model, flat)
        probe.after_backward()
        if i % 4 == 1:  # steps 0-1, 4-5, 8-9 form the pairs; each stands for 4 steps
            a, b = flats[i - 1], flat
            reference.update(from_consecutive(a @ a, b @ b, a @ b, 16, 16), 4 * 16)
    probe.flush()
    assert agent.gns.samples == reference.samples == 3
    assert agent.gns.grad_sqr == pytest.approx(reference.grad_sqr)
    assert agent.gns.grad_var == pytest.approx(reference.grad_var)
    # a rescale between the two steps of a pair drops that pair
    _set_grads(model, flats[0])
    probe.after_backward()
    agent.set_config(2, 16)
    probe.after_backward()
    probe.flush()
    assert agent.gns.samples == 3


def test_torch_probe_preconditions_with_adam_state() -> None:
    torch = pytest.importorskip("torch")
    from bftrainer.trainers.probe import TorchGradientProbe

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.99), eps=1e-6)
    agent = PolluxAgent("j", LIMITS)
    agent.set_config(1, 8)
    probe = TorchGradientProbe(agent, model, opt, every=1)
    _set_grads(model, np.ones(10))
    probe.after_backward()  # before Adam's first step: no pre-conditioner yet, skipped
    probe.flush()
    assert agent.gns.samples == 0
    x, y = torch.randn(8, 4, dtype=torch.double), torch.randn(8, 2, dtype=torch.double)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    v = np.concatenate([opt.state[p]["exp_avg_sq"].numpy().ravel() for p in model.parameters()])
    pre = adam_preconditioner(v, step=3, beta2=0.99, eps=1e-6)
    reference = GradientNoiseScale(LIMITS.base_batch_size)
    rng = np.random.default_rng(1)
    for _ in range(5):
        flat = rng.normal(size=10)
        _set_grads(model, flat)
        probe.after_backward()
        reference.observe([flat], 8, pre)
    probe.flush()
    assert agent.gns.samples == reference.samples == 4
    assert agent.gns.grad_var == pytest.approx(reference.grad_var)
    assert agent.gns.grad_sqr == pytest.approx(reference.grad_sqr)


def test_state_survives_a_restart_through_json() -> None:
    import json

    rng = np.random.default_rng(3)
    agent = PolluxAgent("job-2", LIMITS, clock=lambda: 1.0)
    for nodes, bsz in [(1, 32), (2, 64), (2, 128)]:
        agent.set_config(nodes, bsz)
        for _ in range(5):
            agent.observe_gradients(list(rng.normal(size=(nodes, 8)) + 1.0))
            agent.observe_step(float(predict_step_time(TRUE, nodes, nodes, bsz)))
    saved = json.loads(json.dumps(agent.state()))

    restarted = PolluxAgent("job-2", LIMITS, clock=lambda: 1.0)
    restarted.restore(saved)
    with pytest.raises(ConfigError, match="set_config"):
        restarted.observe_step(0.1)  # the configuration is the new process's to set
    restarted.set_config(2, 128)
    agent.set_config(2, 128)
    assert restarted.metrics() == agent.metrics()
    with pytest.raises(ConfigError, match="'job-2' given to 'other'"):
        PolluxAgent("other", LIMITS).restore(saved)


def test_observe_steps_equals_the_same_steps_one_by_one() -> None:
    times = [0.3, 0.5, 0.4, 0.6, 0.2, 0.5]
    one, bulk = (PolluxAgent("j", LIMITS, warmup_steps=2) for _ in range(2))
    for agent in (one, bulk):
        agent.gns.update_from_norms(10.0, 2.0, 4, 32)  # a PGNS, so progress has gains > 1
        agent.set_config(2, 64)
    for t in times:
        one.observe_step(t)
    bulk.observe_steps(2, 9.0)  # the two warm-up steps: counted, not timed
    bulk.observe_steps(4, sum(times[2:]) / 4)
    assert bulk.steps == one.steps == 6
    assert bulk.progress == pytest.approx(one.progress)
    [a], [b] = bulk.observations(), one.observations()
    assert a.step_time_s == pytest.approx(b.step_time_s) and a.local_bsz == b.local_bsz
    # A fractional count (a simulated interval) weighs the mean by the steps.
    agent = PolluxAgent("j", LIMITS, warmup_steps=0)
    agent.set_config(1, 32)
    agent.observe_steps(0.5, 1.0)
    agent.observe_steps(1.5, 3.0)
    [obs] = agent.observations()
    assert obs.step_time_s == pytest.approx(2.5) and agent.steps == 2.0


@pytest.mark.parametrize("count, mean_s", [(0, 1.0), (-1, 1.0), (2, 0.0), (float("inf"), 1.0)])
def test_observe_steps_refuses_bad_counts_and_times(count: float, mean_s: float) -> None:
    agent = PolluxAgent("j", LIMITS)
    agent.set_config(1, 32)
    with pytest.raises(ConfigError, match=r"count|mean_step_time_s"):
        agent.observe_steps(count, mean_s)


def test_new_configs_and_reading_the_last_fit_without_refitting() -> None:
    agent = PolluxAgent("j", LIMITS, warmup_steps=0)
    agent.set_config(1, 32)
    assert agent.new_configs == 0 and agent.model is None
    agent.set_config(1, 64)  # declared, never run: not a configuration seen
    agent.set_config(1, 32)
    agent.observe_steps(10, 0.1)
    assert agent.new_configs == 1
    first = agent.fit()
    assert agent.new_configs == 0 and agent.model is first
    agent.observe_steps(10, 0.3)  # the same configuration, slower: no new one
    assert agent.new_configs == 0
    assert agent.metrics(refit=False).throughput is first
    assert agent.goodput_model(refit=False) is not None
    assert agent.model is first  # nothing refitted so far
    assert agent.metrics().throughput is not first  # the default refits on new steps
    agent.set_config(2, 64)
    agent.observe_steps(5, 0.2)
    assert agent.new_configs == 1
    # Configurations are observed in the order first timed, not first declared.
    assert [(o.nodes, o.local_bsz) for o in agent.observations()] == [(1, 32), (2, 64)]


def test_fractional_counts_use_up_the_warm_up_and_then_are_timed() -> None:
    agent = PolluxAgent("j", LIMITS, warmup_steps=1)
    agent.set_config(1, 32)
    agent.observe_steps(0.5, 9.0)
    agent.observe_steps(0.5, 9.0)  # the one warm-up step, in two halves
    assert agent.observations() == []
    agent.observe_steps(0.5, 2.0)
    [obs] = agent.observations()
    assert obs.step_time_s == pytest.approx(2.0) and agent.steps == pytest.approx(1.5)


def test_torch_probe_with_capturable_adam_matches_the_plain_one() -> None:
    """Capturable Adam keeps its step counts on the device: the probe computes the bias
    correction there (no read per parameter) and gets what it gets from plain Adam."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("capturable Adam needs a GPU")
    from bftrainer.trainers.probe import TorchGradientProbe

    seen = []
    for capturable in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).cuda()
        opt = torch.optim.Adam(model.parameters(), capturable=capturable)
        agent = PolluxAgent("j", LIMITS)
        agent.set_config(1, 8)
        probe = TorchGradientProbe(agent, model, opt, every=1)
        x, y = torch.randn(8, 4, device="cuda"), torch.randn(8, 2, device="cuda")
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            probe.after_backward()
            opt.step()
        probe.flush()
        seen.append((agent.gns.samples, agent.gns.grad_sqr, agent.gns.grad_var))
    assert seen[0][0] == seen[1][0] > 0
    assert seen[1][1] == pytest.approx(seen[0][1], rel=1e-4)
    assert seen[1][2] == pytest.approx(seen[0][2], rel=1e-4)
