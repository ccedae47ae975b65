"""PyTorch's side of the quickstart's timing: `kiln train --config configs/quickstart.toml` as a
PyTorch user would write it. The same network (ResNet-18, CIFAR stem, width 16), the shipped
digits (1,500 train and 297 validation images, 8x8, gray repeated to RGB), batches of 64 through a
DataLoader, Adam at 4e-3 with cosine annealing per step, 15 epochs, each followed by
validation; all of the CPU's cores. Prints each epoch's seconds (training and validation, as
kiln's epoch line counts them) and the training loop's total; time the whole process from outside
(`/usr/bin/time`) to count Python's and PyTorch's start as kiln's is counted.

    .venv/bin/python xtask/scripts/bench_torch_quickstart.py [--epochs N]

`cargo xtask bench quickstart` runs it beside kiln.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
from make_resnet_fixtures import BasicBlock, cifar_resnet  # noqa: E402

DIGITS = os.path.join(ROOT, "crates", "kiln-data", "assets", "digits.bin")


def digits():
    records = np.fromfile(DIGITS, dtype=np.uint8).reshape(-1, 65)
    labels = torch.from_numpy(records[:, 0].astype(np.int64))
    gray = torch.from_numpy(records[:, 1:].astype(np.float32) / 255.0).reshape(-1, 1, 8, 8)
    images = gray.repeat(1, 3, 1, 1)
    mean, std = images.mean((0, 2, 3), keepdim=True), images.std((0, 2, 3), keepdim=True)
    images = (images - mean) / std
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, val = order[:1500], order[1500:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    train_set, val_set = digits()
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)
    model = cifar_resnet(BasicBlock, [2, 2, 2, 2], 10, 16, False, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=4e-3)
    steps = args.epochs * len(train_loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    loss_fn = nn.CrossEntropyLoss()
    total = time.perf_counter()
    for epoch in range(args.epochs):
        start = time.perf_counter()
        model.train()
        for x, y in train_loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
        print(f"epoch {epoch + 1}: validation top-1 {correct / len(val_set):.2%}, {time.perf_counter() - start:.2f} s")
    print(f"training: {time.perf_counter() - total:.2f} s")


if __name__ == "__main__":
    main()
