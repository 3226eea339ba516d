"""The models the trainer can build, by name.

Neither uses BatchNorm or dropout: both make a sample's gradient depend on which other
samples share its micro-batch (or on an RNG stream), which would break the guarantee
that every split of a global batch trains the same model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from orchestrator.trainer.exits import TrainerUsageError

CNN_INPUT_SHAPE = (3, 32, 32)


class MLP(nn.Module):
    """Flatten, then two ReLU hidden layers and a linear classifier."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class LeNet(nn.Module):
    """The classic LeNet-5 shape for 3x32x32 images (two conv+pool stages, three linears)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` (one sample, no batch dim)."""
    if name == "mlp":
        return MLP(math.prod(input_shape), num_classes)
    if name == "cnn":
        if tuple(input_shape) != CNN_INPUT_SHAPE:
            shape = "x".join(map(str, input_shape))
            raise TrainerUsageError(
                f"--model cnn expects 3x32x32 images but the dataset has {shape} samples; "
                "use --model mlp for other shapes"
            )
        return LeNet(num_classes)
    raise TrainerUsageError(f"--model {name}: unknown; choose one of mlp, cnn")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
