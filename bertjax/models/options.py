"""The names of the options every model family is built with: activations, compute dtypes, rematerialisation
policies and attention kernels. Standard library only (config.py validates against them without JAX);
models/layers.py and attention.py map each name onto the function it stands for, keyed in this order.
"""

ACTIVATION_NAMES = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
DTYPE_NAMES = ("float32", "bfloat16")
REMAT_POLICY_NAMES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLEMENTATIONS = ("xla", "splash", "cudnn", "auto")
