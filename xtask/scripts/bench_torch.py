"""PyTorch's side of `kiln bench`: the same networks, batches and measuring rules, so that the
two can stand in one table (`kiln bench --reference <this script's JSON>`).

A fixed batch of noise already on the device; `--warmup` untimed steps; then timed steps, at least
`--min-steps` and at least `--min-seconds`; each step ends with the host waiting for the device
(reading the loss, or the predicted classes, as kiln does). Training is forward, cross-entropy,
backward and SGD with momentum 0.9. On CUDA each row is measured twice: eager float32, and
channels-last with bfloat16 autocast (how people run PyTorch on GPUs).

Writes a JSON list of rows with kiln's fields (see kiln_check::bench::Measurement).
"""

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision


def network(name):
    """resnet18-cifar: CIFAR stem (3x3 stride-1 conv, no max-pool), 10 classes, 32x32.
    resnetNN: torchvision's, 1000 classes, 224x224."""
    base, _, cifar = name.partition("-")
    if cifar:
        model = getattr(torchvision.models, base)(num_classes=10)
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
        return model, 32, 10
    return getattr(torchvision.models, base)(num_classes=1000), 224, 1000


def default_batches(image_size):
    return [32, 128] if image_size <= 64 else [16, 64]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        try:  # Linux: reset the resident set's high-water mark, as kiln does
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved()
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(name, batch, mode, variant, device, args):
    reset_peak(device)
    torch.manual_seed(0)
    model, size, classes = network(name)
    model = model.to(device)
    images = (torch.rand(batch, 3, size, size, device=device) * 4) - 2
    labels = torch.randint(0, classes, (batch,), device=device)
    fast = variant != "eager"
    if fast:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    if mode == "train":
        model.train()

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            loss.item()
    else:
        model.eval()

        def step():
            with torch.no_grad(), autocast:
                model(images).argmax(1).cpu()

    for _ in range(args.warmup):
        step()
    sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < 200 and (len(times) < args.min_steps or time.perf_counter() - start < args.min_seconds):
        clock = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - clock) * 1000)
    return {
        "framework": "pytorch",
        "variant": variant,
        "device_class": "gpu" if device.type == "cuda" else "cpu",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU",
        "model": name,
        "image_size": size,
        "batch": batch,
        "mode": mode,
        "images_per_s": batch * len(times) / sum(times) * 1000,
        "step_ms": statistics.median(times),
        "steps": len(times),
        "peak_memory_bytes": peak_bytes(device),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, or auto: the CPU, and CUDA where present")
    parser.add_argument("--models", default="resnet18-cifar,resnet50")
    parser.add_argument("--batches", default="", help="for every model (default: as kiln bench)")
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-steps", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    if args.device == "auto":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    else:
        devices = args.device.split(",")
    rows = []
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            print("pytorch cuda: skipped, no CUDA device", file=sys.stderr)
            continue
        rows += measure_all(torch.device(device), args)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=1)


def measure_all(device, args):
    variants = ["eager", "channels_last+bf16"] if device.type == "cuda" else ["eager"]
    rows = []
    for name in args.models.split(","):
        size = network(name)[1]
        batches = [int(b) for b in args.batches.split(",")] if args.batches else default_batches(size)
        for batch in batches:
            for mode in args.modes.split(","):
                for variant in variants:
                    try:
                        row = measure(name, batch, mode, variant, device, args)
                    except torch.OutOfMemoryError:
                        print(f"pytorch {variant} {name} batch {batch} {mode}: out of memory", file=sys.stderr)
                        torch.cuda.empty_cache()
                        continue
                    print(f"pytorch {variant} {name} batch {batch} {mode}: {row['images_per_s']:.1f} img/s, "
                          f"{row['step_ms']:.1f} ms a step", file=sys.stderr)
                    rows.append(row)
    return rows


if __name__ == "__main__":
    main()
