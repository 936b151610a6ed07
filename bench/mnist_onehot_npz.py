"""MNIST as a regression dataset for the MSE parity check: writes an .npz with
x_train/x_test (uint8 [n, 784], as the IDX files hold them) and
y_train/y_test (float32 [n, 10], the one-hot class vector), which stepgraph
reads with `data.train_x: <file>.npz` and `model.loss: mse` and PyTorch's
torch_parity.py --loss mse regresses from the same IDX files.
Usage: python3 mnist_onehot_npz.py DATA_DIR OUT.npz"""
import sys

import numpy as np

import stepgraph_data as sd


def one_hot(labels):
    out = np.zeros((len(labels), 10), dtype=np.float32)
    out[np.arange(len(labels)), labels] = 1.0
    return out


def main():
    data, out = sys.argv[1], sys.argv[2]
    train_x, train_y = sd.load_split(data, "train")
    test_x, test_y = sd.load_split(data, "t10k")
    np.savez(out, x_train=train_x, y_train=one_hot(train_y), x_test=test_x, y_test=one_hot(test_y))


if __name__ == "__main__":
    main()
