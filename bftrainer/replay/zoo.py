"""The built-in model zoo: the BFTrainer paper's Table 2 (Liu et al. 2021).

Measured ImageNet training throughput (samples/s) of seven models on 1..64 Summit nodes
(6 V100 GPUs each). The curves are not concave: AlexNet's slope rises from 4 to 8 nodes.
"""

from __future__ import annotations

ZOO_NODES = (1, 2, 4, 8, 16, 32, 64)

ZOO_SPS: dict[str, tuple[float, ...]] = {
    "AlexNet": (7115.3, 13071.7, 21066.1, 40484.9, 74002.9, 130762.0, 202135.4),
    "vgg16": (1193.3, 2389.2, 4691.7, 9257.9, 18348.9, 36208.5, 70151.7),
    "resnet18": (5218.8, 10582.5, 20436.0, 39584.0, 78023.8, 144762.5, 262723.0),
    "DenseNet": (989.9, 1952.5, 3849.8, 7608.1, 14993.2, 28812.2, 57773.9),
    "mnasnet1": (3245.7, 6001.9, 11489.3, 23075.6, 43899.7, 83474.2, 160493.6),
    "shufflenet": (2831.0, 5259.0, 9988.0, 20379.2, 38895.3, 74125.1, 145081.5),
    "mobilenet": (3039.9, 5893.0, 11386.0, 22024.8, 42488.4, 82268.3, 155213.8),
}


def zoo_curve(model: str) -> tuple[tuple[float, float], ...]:
    """Breakpoints ``(nodes, samples/s)`` of a Table 2 model."""
    try:
        rates = ZOO_SPS[model]
    except KeyError:
        raise KeyError(f"unknown model {model!r}; the zoo has {', '.join(ZOO_SPS)}") from None
    return tuple((float(n), r) for n, r in zip(ZOO_NODES, rates, strict=True))
