"""Data and randomness shared with the C++ runtime, for the PyTorch baselines.

The functions below reproduce runtime/random.hpp and models/param_init.hpp
bit for bit (counter-based SplitMix64 streams), so a PyTorch run can start
from the same initial weights and see the same batches in the same order as
`stepgraph train`.
"""
import gzip
import math
import os
import struct
import sys

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64_mix(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream_u64(key, i):
    return splitmix64_mix(key + (i + 1) * GOLDEN)


def param_key(seed, index):
    return splitmix64_mix(seed) ^ ((0xD1B54A32D192ED03 * (index + 1)) & M64)


def epoch_key(seed, epoch):
    return splitmix64_mix(seed + 0x5851F42D4C957F2D) ^ ((0xD1B54A32D192ED03 * (epoch + 1)) & M64)


def stream_u64_array(key, count):
    """stream_u64(key, i) for i in range(count), vectorised with numpy when available."""
    try:
        import numpy as np
    except ImportError:
        return [stream_u64(key, i) for i in range(count)]
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(count, dtype=np.uint64) + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def epoch_permutation(n, seed, epoch):
    """Fisher-Yates over 0..n-1: for i = n-1 down to 1, j = stream_u64(key, n-1-i) mod (i+1)."""
    key = epoch_key(seed, epoch)
    draws = stream_u64_array(key, max(n - 1, 0))
    draws = draws.tolist() if hasattr(draws, "tolist") else draws
    perm = list(range(n))
    for t in range(n - 1):
        i = n - 1 - t
        j = draws[t] % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def linear_init(count, fan_in, key):
    """Element i = float32((2 * uniform(key, i) - 1) * (1 / sqrt(fan_in))), uniform from the top 53 bits."""
    bound = 1.0 / math.sqrt(fan_in)
    draws = stream_u64_array(key, count)
    if hasattr(draws, "dtype"):
        import numpy as np
        u = (draws >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        return ((2.0 * u - 1.0) * bound).astype(np.float32)
    return [float(struct.unpack("f", struct.pack("f", (2.0 * ((d >> 11) * 2.0 ** -53) - 1.0) * bound))[0]) for d in draws]


def initial_parameters(layers, seed):
    """[(weight [out,in], bias [out])] per layer, as models/mlp.cpp (mlp_initial_parameters) makes them."""
    params = []
    for l in range(1, len(layers)):
        fan_in, units = layers[l - 1], layers[l]
        w = linear_init(units * fan_in, fan_in, param_key(seed, 2 * (l - 1)))
        b = linear_init(units, fan_in, param_key(seed, 2 * (l - 1) + 1))
        params.append((w, b))
    return params


def input_affine(normalize, mean=0.1307, std=0.3081):
    """(scale, shift) with x = pixel * scale + shift, as apps/backend_choice.cpp computes them."""
    if normalize:
        return 1.0 / (255.0 * std), -mean / std
    return 1.0 / 255.0, 0.0


def batch_rows(step, n, batch, seed, cache={}):
    """Row indices of training step `step` (0-based): epoch-local slice of that epoch's permutation."""
    per_epoch = n // batch
    epoch = step // per_epoch
    if cache.get("key") != (n, seed, epoch):
        cache["key"] = (n, seed, epoch)
        cache["perm"] = epoch_permutation(n, seed, epoch)
    first = (step % per_epoch) * batch
    return cache["perm"][first:first + batch]


def read_idx(path):
    """The items of an IDX file (gzip or raw) as (dims, bytes); checks magic and size."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: too short for an IDX header")
    magic = struct.unpack(">I", data[:4])[0]
    if magic not in (0x00000801, 0x00000803):
        raise ValueError(f"{path}: wrong magic number 0x{magic:08x}")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    expected = math.prod(dims)
    if len(body) != expected:
        raise ValueError(f"{path}: expected {expected} bytes of items, found {len(body)}")
    return dims, body


def load_split(folder, prefix, limit=0):
    """(images u8 [n, rows*cols], labels u8 [n]) as numpy arrays."""
    import numpy as np

    def find(name):
        for candidate in (os.path.join(folder, name + ".gz"), os.path.join(folder, name)):
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(f"{folder}: neither {name}.gz nor {name} exists")

    dims, pixels = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    _, labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    images = np.frombuffer(pixels, dtype=np.uint8).reshape(dims[0], dims[1] * dims[2])
    labels = np.frombuffer(labels, dtype=np.uint8)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return images, labels


if __name__ == "__main__" and "--selftest" in sys.argv:
    print("epoch_permutation(10, 1, 0) =", epoch_permutation(10, 1, 0))
    print("epoch_permutation(60000, 1, 0)[:5] =", epoch_permutation(60000, 1, 0)[:5])
    print("linear_init(5, 784, param_key(0, 0)) =", [float(v) for v in linear_init(5, 784, param_key(0, 0))])
