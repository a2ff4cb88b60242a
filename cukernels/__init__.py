"""cukernels: the fully connected layer kernels of the book chapter and the article, on CuPy.

Each public function mirrors one document kernel. numpy arrays run the numpy oracle (the CPU
fallback, cukernels.oracle); cupy arrays run the CUDA kernels. See docs/api.md.
"""
from . import article, multi, oracle
from .runtime import gpu_available
from .activations import (line_activation, lrelu_activation, lrelu_derivative, mask_mult,
                          sigmoid_activation, sigmoid_derivative, softmax_activation,
                          softmax_derivative, swish_activation, swish_derivative,
                          tanh_activation, tanh_derivative)
from .dense import calc_delta_weights, calc_hidden_gradient, perceptron_feed_forward
from .losses import calc_output_gradient
from .optim import (adadelta_update, adagrad_update, adam_update, momentum_update,
                    rmsprop_update, sgd_update)

__version__ = "0.1.0"

__all__ = [
    "perceptron_feed_forward", "line_activation", "sigmoid_activation", "sigmoid_derivative",
    "tanh_activation", "tanh_derivative", "lrelu_activation", "lrelu_derivative",
    "swish_activation", "swish_derivative", "softmax_activation", "softmax_derivative",
    "calc_output_gradient", "calc_hidden_gradient", "calc_delta_weights", "sgd_update",
    "momentum_update", "adagrad_update", "rmsprop_update", "adadelta_update", "adam_update",
    "mask_mult", "article", "multi", "oracle", "gpu_available",
]
