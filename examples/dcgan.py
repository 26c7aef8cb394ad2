"""DCGAN on scikit-learn's 8x8 digits, ported from pytorch/examples' dcgan: two networks, two optimizers, one
manual ``training_step`` (the discriminator's update, then the generator's), run by the Trainer.

What the Trainer keeps for it: the fp16 GradScaler (``--precision fp16-mixed``), accumulation (both optimizers step
once per window), clipping, both optimizers and schedulers in every checkpoint (a mid-epoch resume is bit-exact), the
progress bar and the History (``loss`` is the generator's, ``d_loss`` the discriminator's). Every epoch the generator
draws a grid from the same fixed noise (``nbtrainer.Samples``: in ``history.samples``, the panel's samples section and
the HTML report), as the TensorFlow DCGAN tutorial does with matplotlib, without changing the run.

    python examples/dcgan.py [--epochs 5] [--precision bf16-mixed] [--accum 2] [--report gan.html]
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Samples, Trainer

NZ = 16  # the generator's noise size


class GAN(nn.Module):
    """The generator (noise -> an 8x8 image in [-1, 1]) and the discriminator (image -> a real/fake logit)."""

    def __init__(self, nz: int = NZ, width: int = 32) -> None:
        super().__init__()
        self.generator = nn.Sequential(
            nn.ConvTranspose2d(nz, width * 2, 2, 1, 0, bias=False),  # 1x1 -> 2x2
            nn.BatchNorm2d(width * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(width * 2, width, 4, 2, 1, bias=False),  # -> 4x4
            nn.BatchNorm2d(width),
            nn.ReLU(True),
            nn.ConvTranspose2d(width, 1, 4, 2, 1, bias=False),  # -> 8x8
            nn.Tanh(),
        )
        self.discriminator = nn.Sequential(
            nn.Conv2d(1, width, 4, 2, 1, bias=False),  # 8x8 -> 4x4
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),  # -> 2x2
            nn.BatchNorm2d(width * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width * 2, 1, 2, 1, 0, bias=False),  # -> 1x1: the logit
            nn.Flatten(),
        )
        self.nz = nz

    def sample(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.generator(torch.randn(n, self.nz, 1, 1, device=device))


def noise_grid(n: int = 16, seed: int = 0) -> Samples:
    """The generator's images from one fixed noise batch, tiled into a square grid, at the end of every epoch (and
    the step-0 baseline): the same latent points, so the grids show what training changed."""
    side = int(n**0.5)
    noise = torch.randn(side * side, NZ, 1, 1, generator=torch.Generator().manual_seed(seed))

    def grid(gan: GAN) -> torch.Tensor:
        images = gan.generator(noise.to(next(gan.parameters()).device)).float()  # (n, 1, 8, 8) in [-1, 1]
        tiles = images[:, 0].reshape(side, side, 8, 8).permute(0, 2, 1, 3).reshape(side * 8, side * 8)
        return (tiles + 1) / 2  # an (H, W) picture in [0, 1]

    return Samples(grid, name="fixed noise")


def optimizers(gan: GAN, lr: float = 2e-4) -> dict[str, torch.optim.Optimizer]:
    """One optimizer per network, as in pytorch/examples (Adam, betas 0.5 / 0.999)."""
    return {
        "d": torch.optim.Adam(gan.discriminator.parameters(), lr=lr, betas=(0.5, 0.999)),
        "g": torch.optim.Adam(gan.generator.parameters(), lr=lr, betas=(0.5, 0.999)),
    }


def training_step(step, batch):  # type: ignore[no-untyped-def]
    """One batch: update D on real and fake images, then G to fool D. Returns the two losses."""
    (real,) = batch[:1]
    gan = step.model
    bce = nn.functional.binary_cross_entropy_with_logits  # safe under autocast, unlike BCELoss after a sigmoid
    ones = torch.ones(real.shape[0], 1, device=real.device)
    zeros = torch.zeros_like(ones)
    fake = gan.sample(real.shape[0], real.device)
    d_loss = bce(gan.discriminator(real), ones) + bce(gan.discriminator(fake.detach()), zeros)
    step.backward(d_loss, optimizer="d")  # only D's parameters get gradients
    step.step("d")
    g_loss = bce(gan.discriminator(fake), ones)
    step.backward(g_loss, optimizer="g")  # only G's: D's gradients from this loss would be stale noise
    step.step("g")
    return {"loss": g_loss, "d_loss": d_loss}


def validation_step(gan, batch):  # type: ignore[no-untyped-def]
    """D's loss on held-out real images and fresh fakes, and G's loss, without updates."""
    (real,) = batch[:1]
    bce = nn.functional.binary_cross_entropy_with_logits
    ones = torch.ones(real.shape[0], 1, device=real.device)
    fake = gan.sample(real.shape[0], real.device)
    d_loss = bce(gan.discriminator(real), ones) + bce(gan.discriminator(fake), torch.zeros_like(ones))
    return {"loss": bce(gan.discriminator(fake), ones), "d_loss": d_loss}


def digits(batch_size: int = 64, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """The digits as images in [-1, 1] (the generator's Tanh range): a shuffled training loader and a held-out one."""
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    train, val = x[order[:1500]], x[order[1500:]]
    return (
        DataLoader(TensorDataset(train), batch_size=batch_size, shuffle=True, generator=g),
        DataLoader(TensorDataset(val), batch_size=256),
    )


def build(*, precision: str | None = None, accum: int = 1, seed: int = 0, **kwargs) -> Trainer:  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    gan = GAN()
    return Trainer(
        gan, None, optimizers(gan), training_step=training_step, validation_step=validation_step,
        precision=precision, grad_accum_steps=accum, seed=seed, **kwargs,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--precision", default=None)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--report", default=None, help="write the History's HTML report (with the last grid) here")
    args = ap.parse_args()
    train, val = digits()
    trainer = build(precision=args.precision, accum=args.accum, run_store=False, callbacks=[noise_grid()])
    history = trainer.fit(train, val, epochs=args.epochs)
    last = history.epochs[-1]
    print(f"D loss {last['d_loss']:.3f}, G loss {last['loss']:.3f} after {args.epochs} epochs")
    print(f"{len(history.samples)} fixed-noise grids (steps {[s['step'] for s in history.samples]})")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            fh.write(history.to_html(title="DCGAN on digits"))


if __name__ == "__main__":
    main()
