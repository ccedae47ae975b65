"""PyTorch's side of `cargo xtask bench train`: `kiln train --config configs/cifar10-resnet18-sgd.toml`
as a PyTorch user writes it. torchvision's CIFAR10 dataset (its own __getitem__: a PIL image per
item), RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor and Normalize, a DataLoader with
the config's workers, ResNet-18 with the CIFAR stem, SGD (lr 0.1, Nesterov momentum 0.9, weight
decay 5e-4) with cosine annealing per step, cross-entropy; each epoch followed by validation on
the test batch. Prints kiln's epoch line's figures: the epoch's seconds (training and validation)
and training images per second over them.

    .venv/bin/python xtask/scripts/bench_torch_train.py --root DIR --batch 128 [--epochs 2] [--workers 4]

DIR holds `cifar-10-batches-bin` (the binary format, which kiln reads too; the xtask writes one
of random images, since the real one cannot be downloaded everywhere).
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets.vision import VisionDataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
from make_resnet_fixtures import BasicBlock, cifar_resnet  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class BinaryCIFAR10(torchvision.datasets.CIFAR10):
    """torchvision's CIFAR10, read from the binary format: the same arrays (`data` as N x 32 x 32 x
    3 uint8, `targets`), so that torchvision's own `__getitem__` serves each item."""

    def __init__(self, root, train, transform):
        VisionDataset.__init__(self, root, transform=transform)
        folder = os.path.join(root, "cifar-10-batches-bin")
        names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
        records = np.concatenate(
            [np.fromfile(os.path.join(folder, name), dtype=np.uint8).reshape(-1, 3073) for name in names]
        )
        self.train = train
        self.targets = records[:, 0].astype(np.int64).tolist()
        self.data = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
        with open(os.path.join(folder, "batches.meta.txt")) as meta:
            self.classes = [line.strip() for line in meta if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    normalize = T.Normalize(MEAN, STD)
    train_set = BinaryCIFAR10(
        args.root,
        True,
        T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), normalize]),
    )
    val_set = BinaryCIFAR10(args.root, False, T.Compose([T.ToTensor(), normalize]))
    loader = dict(batch_size=args.batch, num_workers=args.workers, persistent_workers=args.workers > 0)
    train_loader = DataLoader(train_set, shuffle=True, **loader)
    val_loader = DataLoader(val_set, **loader)
    model = cifar_resnet(BasicBlock, [2, 2, 2, 2], 10, 64, False, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps = args.epochs * len(train_loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        loss_sum, seen = 0.0, 0
        for x, y in train_loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        print(
            f"epoch {epoch + 1}: train loss {loss_sum / seen:.4f}, validation top-1 {correct / len(val_set):.2%}, "
            f"{seconds:.2f} s, {seen / seconds:.1f} img/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
