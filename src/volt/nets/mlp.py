import math

from torch import Tensor, nn


class MLP(nn.Module):
    """Flatten, then Linear -> BatchNorm -> ReLU -> Dropout per hidden layer, then a linear head."""

    def __init__(
        self,
        in_shape: tuple[int, ...],
        num_classes: int,
        hidden_sizes: list[int],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(in_shape)
        for hidden in hidden_sizes:
            layers += [
                nn.Linear(width, hidden),
                nn.BatchNorm1d(hidden),
                nn.ReLU(),
                nn.Dropout(dropout),
            ]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # (B, C, H, W) -> (B, num_classes)
