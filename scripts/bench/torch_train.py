#!/usr/bin/env python3
"""PyTorch's side of the memory benchmark: the training run of configs/fmnist_mlp.yaml or
configs/fmnist_cnn.yaml (same model, Adam lr 1e-3, batch 128, shuffled batches, normalised
inputs, an evaluation over the test set at the end), so that the peak resident memory of the
two runs (/usr/bin/time -v) compares like with like. Prints the test accuracy.

  torch_train.py mlp|cnn [--steps=N]   (N = 0: two epochs, as the configs)"""
import gzip
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = "/usr/share/datasets/fashion-mnist"
BATCH, EVAL_BATCH = 128, 1000


def idx(name):
    with gzip.open(os.path.join(ROOT, name)) as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32),
                         nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                         nn.BatchNorm2d(64), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(576, 10))


def batch(images, lo, hi, order, mean, std):
    x = torch.from_numpy(images[order[lo:hi]].astype(np.float32) / 255.0)
    return ((x - mean) / std).reshape(-1, 1, 28, 28)


def main():
    name = sys.argv[1]
    steps = next((int(a[8:]) for a in sys.argv[2:] if a.startswith("--steps=")), 0)
    torch.set_num_threads(int(os.environ.get("THREADS") or os.cpu_count()))
    torch.manual_seed(0)
    train_x, train_y = idx("train-images-idx3-ubyte.gz"), idx("train-labels-idx1-ubyte.gz").astype(np.int64)
    test_x, test_y = idx("t10k-images-idx3-ubyte.gz"), idx("t10k-labels-idx1-ubyte.gz").astype(np.int64)
    mean, std = float(train_x.mean()) / 255.0, float(train_x.std()) / 255.0
    net = model(name)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    per_epoch = len(train_x) // BATCH
    total = steps or 2 * per_epoch
    rng = np.random.default_rng(0)
    step = 0
    while step < total:
        order = rng.permutation(len(train_x))
        for b in range(per_epoch):
            if step == total:
                break
            lo, hi = b * BATCH, (b + 1) * BATCH
            loss = F.cross_entropy(net(batch(train_x, lo, hi, order, mean, std)), torch.from_numpy(train_y[order[lo:hi]]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    net.eval()
    correct = 0
    with torch.no_grad():
        order = np.arange(len(test_x))
        for lo in range(0, len(test_x), EVAL_BATCH):
            pred = net(batch(test_x, lo, lo + EVAL_BATCH, order, mean, std)).argmax(1)
            correct += int((pred == torch.from_numpy(test_y[lo:lo + EVAL_BATCH])).sum())
    print(f"{name}: {step} steps, test accuracy {100.0 * correct / len(test_x):.2f}%")


if __name__ == "__main__":
    main()
