"""The model and each node's data: a torch logistic regression on a synthetic two-class task.
Every node generates its own examples (no download): the data of node ``partition`` never leaves
it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

FEATURES = 10
TRUE_W = np.linspace(-1.0, 1.0, FEATURES)  # the public task: which direction separates the classes


def model() -> nn.Module:
    torch.manual_seed(0)  # the initial model is public
    return nn.Linear(FEATURES, 1)


def node_data(partition: int, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's examples (one user's data in the cross-device setting)."""
    rng = np.random.default_rng(1000 + partition)
    x = rng.normal(size=(n, FEATURES))
    y = (x @ TRUE_W + 0.5 * rng.normal(size=n) > 0).astype(np.float32)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def train(net: nn.Module, x, y, epochs: int, lr: float) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(net(x).squeeze(-1), y)
        loss.backward()
        opt.step()
    return float(loss.detach())


def evaluate(net: nn.Module, x, y) -> tuple[float, float]:
    with torch.no_grad():
        logits = net(x).squeeze(-1)
        loss = float(nn.BCEWithLogitsLoss()(logits, y))
        acc = float(((logits > 0).float() == y).float().mean())
    return loss, acc
