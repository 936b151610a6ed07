"""The MNIST CNN of the PyTorch benchmark report (configs/mnist_cnn.yaml) in
PyTorch, shared by the CNN baseline (torch_cnn_bench.py) and the CNN parity
run (torch_parity.py --model report_cnn):
  conv 1->10 k5, max-pool 2, ReLU; conv 10->20 k5, dropout2d, max-pool 2,
  ReLU; flatten (320); linear 320->50, ReLU, dropout; linear 50->10;
  log_softmax + NLL.
initial_cnn_parameters() reproduces models/sequential.cpp's initialisation
(sequential_initial_parameters) bit for bit, so a PyTorch run can start from
stepgraph's weights."""
import numpy as np
import torch
import torch.nn.functional as F

import stepgraph_data as sd

# (kind, out channels / units, kernel) of the report's layers with parameters, in order.
REPORT_LAYERS = [("conv", 10, 5), ("conv", 20, 5), ("linear", 50, 0), ("linear", 10, 0)]


class ReportNet(torch.nn.Module):
    def __init__(self, dropout=0.5):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d(dropout)
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)
        self.dropout = dropout

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def initial_cnn_parameters(seed):
    """[(weight, bias)] per layer with parameters: element order and values of
    models/sequential.cpp (fan_in = weight elements / out, the same bound as
    PyTorch's default)."""
    params, in_channels, in_features = [], 1, 320
    for k, (kind, out, kernel) in enumerate(REPORT_LAYERS):
        shape = (out, in_channels, kernel, kernel) if kind == "conv" else (out, in_features if k == 2 else 50)
        count = int(np.prod(shape))
        fan_in = count // out
        w = np.asarray(sd.linear_init(count, fan_in, sd.param_key(seed, 2 * k)), dtype=np.float32).reshape(shape)
        b = np.asarray(sd.linear_init(out, fan_in, sd.param_key(seed, 2 * k + 1)), dtype=np.float32)
        params.append((w, b))
        in_channels = out
    return params


def build_report_cnn(seed, device, dropout=0.5):
    net = ReportNet(dropout)
    with torch.no_grad():
        for module, (w, b) in zip([net.conv1, net.conv2, net.fc1, net.fc2], initial_cnn_parameters(seed)):
            module.weight.copy_(torch.from_numpy(w))
            module.bias.copy_(torch.from_numpy(b))
    return net.to(device)
