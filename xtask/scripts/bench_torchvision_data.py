"""torchvision's side of `cargo xtask bench data`: ImageFolder + Resize/CenterCrop/ToTensor/
Normalize on PIL images, one process, one thread, as a DataLoader with num_workers=0 runs it.

Prints one JSON line: {"images": n, "seconds": s, "images_per_s": r}.
"""

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.set_num_threads(1)
    transform = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = datasets.ImageFolder(args.root, transform=transform)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=0)

    for _ in loader:  # warm-up pass: file cache, allocator
        pass
    start = time.perf_counter()
    images = 0
    for _ in range(args.passes):
        for batch, _labels in loader:
            images += batch.shape[0]
    seconds = time.perf_counter() - start
    print(json.dumps({"images": images, "seconds": seconds, "images_per_s": images / seconds}))


if __name__ == "__main__":
    main()
