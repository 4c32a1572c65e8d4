from torch import Tensor, nn


class SmallCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU -> MaxPool per stage, global average pool, then an MLP head."""

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        channels: list[int],
        hidden_size: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width, size = in_shape[0], min(in_shape[1:])
        for out in channels:
            layers += [
                nn.Conv2d(width, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(),
            ]
            if size >= 4:  # keep at least 2x2 so an 8x8 digit survives two stages
                layers.append(nn.MaxPool2d(2))
                size //= 2
            width = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))  # (B, C, H, W) -> (B, num_classes)
