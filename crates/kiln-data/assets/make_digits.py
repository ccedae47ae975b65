"""Converts scikit-learn's copy of the UCI handwritten digits into kiln's `digits.bin`.

Run with the project's venv (scikit-learn installed):
    .venv/bin/python crates/kiln-data/assets/make_digits.py

The file holds the 1,797 images in scikit-learn's order, one 65-byte record each: the label
(0-9), then the 8x8 pixels row by row, scaled from the original 0-16 gray levels to 0-255.
"""

import os

import numpy as np
from sklearn.datasets import load_digits

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 64)
    labels = digits.target.astype(np.uint8).reshape(-1, 1)
    records = np.concatenate([labels, pixels], axis=1)
    assert records.shape == (1797, 65)
    records.tofile(os.path.join(HERE, "digits.bin"))


if __name__ == "__main__":
    main()
