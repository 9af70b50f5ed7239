import os

import torch

# Triton kernels run on CPU tensors under the interpreter; it must be chosen before triton is imported.
# With a GPU present the kernel tests run compiled on CUDA instead.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
