"""show_batch's text form: each item with its target, whatever the number of features."""

from __future__ import annotations

import base64
import io
import re
from typing import Any

import numpy as np
import torch

from nbtrainer import show_batch


def test_a_wide_table_row_keeps_its_target_in_the_text() -> None:
    x, y = torch.randn(6, 64), torch.tensor([3, 1, 4, 1, 5, 9])  # digits-like: 64 features per row
    lines = str(show_batch((x, y), 3, classes=[f"digit {d}" for d in range(10)])).splitlines()[1:]
    assert [line.rsplit(" -> ", 1)[-1] for line in lines] == ["digit 3", "digit 1", "digit 4"]
    assert all(line.count("=") == 8 and ", ..." in line for line in lines)  # the first 8 features, then more
    narrow = str(show_batch((torch.randn(4, 3), torch.arange(4)), 2, feature_names=["a", "b", "c"]))
    assert narrow.splitlines()[1].startswith("a=") and narrow.splitlines()[1].endswith(" -> 0")


def _pictures(view: Any) -> list[np.ndarray]:
    from PIL import Image

    found = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", view.html)
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(b)))) for b in found]


def test_images_draw_in_their_layout_and_on_their_scale_whatever_the_pipeline() -> None:
    """NumPy / PIL pipelines hand (N, H, W, C) uint8 batches, `torch.tensor(list_of_pixels)` int64 ones: each item is
    drawn as the picture it is (its own layout, 0-255 as pixels), not skipped nor clipped to white."""
    g = torch.Generator().manual_seed(0)
    hwc = torch.randint(0, 256, (4, 5, 7, 3), dtype=torch.uint8, generator=g)
    grey = torch.randint(0, 256, (4, 5, 7, 1), dtype=torch.uint8, generator=g)
    chw_long = torch.randint(0, 256, (4, 3, 5, 7), generator=g)  # int64
    hw_long = torch.randint(0, 256, (4, 5, 7), generator=g)
    mnist = torch.rand(4, 28, 28, generator=g)
    cases = [
        (hwc, hwc.numpy()),
        (grey, grey[..., 0].numpy()),
        (chw_long, chw_long.permute(0, 2, 3, 1).numpy().astype(np.uint8)),
        (hw_long, hw_long.numpy().astype(np.uint8)),
        (mnist, (mnist.numpy() * 255 + 0.5).astype(np.uint8)),
    ]
    for x, expected in cases:
        view = show_batch((x, torch.arange(4)), 2)
        pictures = _pictures(view)
        assert len(pictures) == 2, (x.dtype, x.shape, view.text)
        for got, want in zip(pictures, expected[:2], strict=True):
            assert got.shape == want.shape and np.array_equal(got, want), (x.dtype, x.shape)
        assert "stretched" not in view.text  # pixels as they are: nothing to say
    # normalized images (negative values): each stretched to its own range, and said
    normalized = torch.randn(4, 3, 5, 7, generator=g)
    view = show_batch((normalized, torch.arange(4)), 2)
    first = _pictures(view)[0]
    assert first.shape == (5, 7, 3) and first.min() == 0 and first.max() == 255
    assert "stretched to its own range" in view.text


def test_decode_gets_each_items_real_tokens_not_the_batchs_padding() -> None:
    """A tokenizer's batch pads its rows to one length: decode= gets each item's positions its attention_mask keeps
    (right or left padding), in the picture and in the text, not the pad ids a plain function would spell out."""
    ids = torch.tensor([[5, 6, 7, 0, 0], [0, 0, 0, 8, 9], [4, 4, 4, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1]])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([1, 0, 1])}
    got: list[list[int]] = []

    def decode(token_ids: list[int]) -> str:
        got.append(list(token_ids))
        return " ".join(f"w{i}" for i in token_ids)

    view = show_batch([batch], 3, decode=decode)
    assert got and all(g in ([5, 6, 7], [8, 9], [4, 4, 4, 4, 4]) for g in got)
    assert str(view).splitlines()[1:] == ["0: w5 w6 w7 -> 1", "1: w8 w9 -> 0", "2: w4 w4 w4 w4 w4 -> 1"]
    assert "w0" not in view.html and "w5 w6 w7" in view.html
