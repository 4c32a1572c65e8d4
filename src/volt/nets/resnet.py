from torch import Tensor, nn


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual; a 1x1 projection when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet for small images (CIFAR-style 3x3 stem, no max-pool); each stage after the first
    halves the resolution and uses the next width."""

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        widths: list[int],
        blocks_per_stage: list[int],
    ) -> None:
        super().__init__()
        if not widths:
            raise ValueError(
                "model.net.widths is empty; give at least one stage, "
                "e.g. model.net.widths=[64] model.net.blocks_per_stage=[2]"
            )
        if len(widths) != len(blocks_per_stage):
            raise ValueError(
                f"model.net.widths has {len(widths)} stages but model.net.blocks_per_stage has "
                f"{len(blocks_per_stage)}; give both the same length"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_shape[0], widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        width = widths[0]
        for i, (out, blocks) in enumerate(zip(widths, blocks_per_stage, strict=True)):
            for b in range(blocks):
                stages.append(BasicBlock(width, out, stride=2 if i > 0 and b == 0 else 1))
                width = out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stages(self.stem(x)))  # (B, C, H, W) -> (B, num_classes)
