"""Fixtures shared by the ops tests."""
import pytest
import torch


@pytest.fixture
def interpreter_bf16_dot(monkeypatch):
    """The interpreter's ``tl.dot`` multiplies bfloat16's uint16 bit patterns (triton-lang/triton#11584): widen both
    operands to float32 exactly, as the tensor cores do; nothing is patched on CUDA."""
    if torch.cuda.is_available():
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    original = interpreter.InterpreterBuilder.create_dot

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    monkeypatch.setattr(interpreter.InterpreterBuilder, 'create_dot',
                        lambda self, a, b, *args, **kwargs: original(self, widened(a), widened(b), *args, **kwargs))
