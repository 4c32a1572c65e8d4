"""Random crop with padding, horizontal flip and normalisation of whole image batches, on the
device the batch is on (`volt.data.batches` decides which random numbers each batch gets)."""

import functools
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ImageTransform:
    """Whole-batch augmentation and normalisation, on the device the batch is on.

    uint8 images are scaled to [0, 1] first. `crop_padding` > 0: each image is padded with zeros
    by that many pixels and a random crop of the original size taken; `flip`: half the images are
    mirrored left to right. Both need a generator; without one (evaluation) only normalisation runs.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0
    flip: bool = False

    @property
    def random(self) -> bool:
        return self.crop_padding > 0 or self.flip

    def __call__(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One batch, its random numbers drawn from `generator`."""
        draws = None if generator is None else self.draw(generator, len(images), images.device)
        return self.apply(images, draws)

    def draw(
        self, generator: torch.Generator, count: int, device: torch.device
    ) -> tuple[Tensor, Tensor] | None:
        """The random numbers of `count` images: each one's crop corner in the padded image
        (count, 2) and whether it is mirrored (count,); None where nothing is random."""
        if not self.random:
            return None
        span = 2 * self.crop_padding + 1
        corner = torch.randint(0, span, (count, 2), device=device, generator=generator)
        mirrored = torch.rand(count, device=device, generator=generator) < 0.5
        return corner, mirrored

    def apply(self, images: Tensor, draws: tuple[Tensor, Tensor] | None) -> Tensor:
        """The images cropped and flipped as `draws` say (none: evaluation), then normalised."""
        if draws is not None:
            images = self.crop_and_flip(images, *draws)
        scale, shift = self._affine(images.device, images.dtype)
        return torch.addcmul(shift, images.float(), scale)

    @functools.cache  # noqa: B019  # a few instances per run, each kept for the run anyway
    def _affine(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(scale, shift) with normalised = stored * scale + shift, made on `device` once: a copy
        from the host each step would make the CPU wait for the GPU."""
        to_unit = 1 / 255 if dtype == torch.uint8 else 1.0
        std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        return (to_unit / std).to(device), (-mean / std).to(device)

    def crop_and_flip(self, images: Tensor, corner: Tensor, mirrored: Tensor) -> Tensor:
        n, channels, height, width = images.shape
        device, pad = images.device, self.crop_padding
        padded = torch.nn.functional.pad(images, (pad, pad, pad, pad))
        images_at, channels_at, rows_at, cols_at = _positions(n, channels, height, width, device)
        rows = corner[:, :1] + rows_at  # (N, H) into the padded image
        cols = corner[:, 1:] + cols_at  # (N, W)
        if self.flip:
            cols = torch.where(mirrored[:, None], cols.flip(-1), cols)
        return padded[images_at, channels_at, rows.view(n, 1, height, 1), cols.view(n, 1, 1, width)]


@functools.cache
def _positions(
    n: int, channels: int, height: int, width: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The batch's image and channel indices, (N, 1, 1, 1) and (1, C, 1, 1), and its rows' and
    columns' positions, (H,) and (W,): made once per batch shape and device (a run sees one or
    two: its batch and the last, smaller one), not four kernel launches and allocations a step
    (the eager ResNet's torch.profiler trace on an H200, torch 2.11: its only `aten::arange`s, 0.14
    ms of CPU a step under the profiler)."""
    return (
        torch.arange(n, device=device).view(n, 1, 1, 1),
        torch.arange(channels, device=device).view(1, channels, 1, 1),
        torch.arange(height, device=device),
        torch.arange(width, device=device),
    )
