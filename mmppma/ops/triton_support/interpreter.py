"""Triton's interpreter (``TRITON_INTERPRET=1``: the kernels on CPU tensors, the simulated GPU) as the kernels need
it. Its ``tl.dot`` multiplies bfloat16's uint16 bit patterns (triton-lang/triton#11584): while a launch on CPU
tensors runs, :func:`exact_bf16_dots` widens bfloat16 operands to float32 - exactly, as the tensor cores do."""
import contextlib
from typing import Iterator


@contextlib.contextmanager
def exact_bf16_dots() -> Iterator[None]:
    """Within the block, the interpreter's ``tl.dot`` takes bfloat16 operands as the float32 numbers they are."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        # bfloat16 is the upper half of a float32: its bits shifted up are that float32, exactly
        bits = np.asarray(handle.data).astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    builder.create_dot = lambda self, a, b, *args, **kwargs: original(self, widened(a), widened(b), *args, **kwargs)
    try:
        yield
    finally:
        builder.create_dot = original
