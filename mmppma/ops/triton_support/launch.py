"""Launch parameters of every Triton kernel: tiles, warps and stages per GPU capability, the dot precision, and
:class:`Launch`, one kernel launch as the ops run it and as ``tools/check_kernels.py`` compiles it.

The tables below were sized with ``tools/check_kernels.py`` (shared memory within each capability's per-block
limit, no register spills); docs/benchmarks.md lists what they compile to.
"""
import contextlib
import dataclasses
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import torch

from ..devices import device_capability, tf32_matmul
from .interpreter import exact_bf16_dots

#: per-block shared memory limit in bytes, by compute capability (major * 10 + minor)
SHARED_MEMORY_LIMIT = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
#: above this many tokens (whole attention) or this line length (row/column attention) the large tiles apply
LARGE = 1024
#: whole attention on images narrower than this many tokens takes the narrow tiles; taller ones run transposed
NARROW = 16
#: CUDA's limits on the grid: programs along axis 0, 1 and 2
GRID_LIMITS = (2**31 - 1, 65535, 65535)


class LaunchLimitError(RuntimeError):
    """A launch whose grid exceeds :data:`GRID_LIMITS` (CUDA refuses it)."""


class KernelLoadError(RuntimeError):
    """A compiled kernel that the driver cannot load on the device (for example a driver too old for the PTX)."""


def pow2(x: int, least: int = 16) -> int:
    """The power of two >= max(x, least): the padded size of a tile dimension of extent ``x``."""
    return max(least, 1 << (int(x) - 1).bit_length())


def triton_version() -> Tuple[int, int]:
    """(major, minor) of the installed triton."""
    import triton
    major, minor = triton.__version__.split('.')[:2]
    return int(major), int(minor)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers (``triton.cdiv`` without its constexpr wrapper's host cost)."""
    return -(-a // b)


def kernel_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v as the strided kernels read them: channels contiguous, k with q's strides (copies only where the
    caller's layout is not that)."""
    if q.stride(-1) != 1 or k.stride() != q.stride():
        q, k = q.contiguous(), k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    return q, k, v


def capability(device: torch.device) -> int:
    """Compute capability as major * 10 + minor of a (simulated) CUDA device
    (:func:`mmppma.ops.devices.device_capability`); 0 for the interpreter (CPU tensors); the recorded capability
    inside :func:`recording`."""
    if _RECORDING:
        return _RECORDING[-1][0]
    return device_capability(device)


def precision(dtype: torch.dtype) -> Optional[str]:
    """``tl.dot`` input precision: float32 inputs follow torch's TF32 setting for CUDA matmuls (TF32 tensor cores
    when on, exact 'ieee' products otherwise); half inputs take triton's default (tensor cores with float32
    accumulation)."""
    if dtype != torch.float32:
        return None
    return 'tf32' if tf32_matmul() else 'ieee'


@contextlib.contextmanager
def tf32_matmuls(on: bool) -> Iterator[None]:
    """Within the block, float32 CUDA matmuls (and the kernels' float32 products, :func:`precision`) use TF32 or
    not; torch's setting is restored after it. Set through ``fp32_precision`` where torch has it (after a mix of
    the two APIs, reading the legacy flag raises), else through ``allow_tf32``."""
    matmul = torch.backends.cuda.matmul
    name = 'fp32_precision' if hasattr(matmul, 'fp32_precision') else 'allow_tf32'
    saved = getattr(matmul, name)
    setattr(matmul, name, ('tf32' if on else 'ieee') if name == 'fp32_precision' else on)
    try:
        yield
    finally:
        setattr(matmul, name, saved)


@dataclasses.dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    #: register budget per thread (ptxas's .maxnreg). Without one ptxas picks its own, favouring occupancy, and
    #: spills small-tile float32 kernels at 64-168 registers; 255 is the ISA's maximum.
    maxnreg: int = 255
    #: the kernel family whose table row this is (set by :func:`config`)
    family: str = ''


# The interpreter runs programs one by one, at a cost per program and per operation nearly independent of the tile
# size: one configuration with tiles as large as the small GPU ones, so the tests' maps still span several blocks.
_INTERPRETER = Config(32, 32, 1, 1)
# Whole attention on images narrower than NARROW tokens (and no taller, so N < 256): a block spans many image
# rows, and the work per row grows with them, so blocks stay short (:func:`narrow_tiles`).
# Half precision -> {capability (0: any other): config}; over 4 warps where 2 spill (half precision on sm_86 / sm_89,
# float32 everywhere); over 1 on sm_80 and sm_90, where one warp holds a 16 x 16 tile's products alone (7 x 7 maps:
# predicted 2.5-2.9x -> 2.1-2.2x flash per real score, whole attention's backward; tools/kernel_model.py).
_NARROW: Dict[bool, Dict[int, Config]] = {
    False: {0: Config(16, 16, 4, 1)},
    True: {0: Config(16, 16, 2, 1), **{cap: Config(16, 16, 1, 1) for cap in (80, 90)},
           **{cap: Config(16, 16, 4, 1) for cap in (86, 89)}},
}

# (family, long sequence (:func:`long_tiles`), half precision) -> {capability (0: any other): config}. In the
# tensor-core layout a tile's rows are split over the warps 16 rows each, so num_warps = own block / 16 and no warp
# holds a replica; each vector along the other axis costs (other block) / 4 registers per thread. Half precision at
# LARGE tokens or more: the forwards take 64 x 64 tiles (FlashAttention's), but whole attention's, which holds two
# (query x key) tiles of corner terms per column chunk, 64 x 32 where its products' operands sit in registers (every
# target but sm_90's warp-group products: 64 x 64 spills 16-376 B there). Whole attention's backward holds (own token x
# column) sums of the score gradient besides its tiles: 64 own tokens against 32 others (64 others spill on sm_80 to
# sm_89); on sm_90 the keys' programs take 64 others where a tile spans at most two map rows (more spill; the queries'
# programs spill there under triton 3.6). Its own tiles are consecutive map tokens, at least 16 per warp (128 own tokens
# over 8 warps on sm_90 and sm_80 are predicted slower per real score: tools/kernel_model.py). Exact float32 products
# run on the FMA units, whose operand tiles cost more registers, so float32 tiles are 16-32 wide. The forward families
# take 2 stages: their key loops are software-pipelined (the next key block's loads overlap the current block's math),
# which holds the prefetched block in registers too; the float32 whole-attention and line forwards take 8 warps on short
# sequences for it (4 spill: on sm_90, and on every target at d 32 for the line forward) and the whole-attention one 32
# x 16 tiles on sm_86 / sm_89 / sm_90 (64 x 32 spill). The remaining choices are the ones that compile without spills at
# the checked shapes (tools/check_kernels.py). sm_100 (B200) takes the default rows, its 4-warp tiles on tensor-memory
# products (tcgen05) and the smaller ones on warp-level products (HMMA); sm_120 (RTX 50) takes them on HMMA, but for
# whole attention's half-precision backward on long sequences: 64 own tokens against 16 others (64 x 32 spills there,
# 128-240 B), and PPMLA's half-precision backward, 64 x 16 as on sm_86 / sm_89 (64 x 32 spills 24-124 B).
_TABLE: Dict[Tuple[str, bool, bool], Dict[int, Config]] = {
    ('whole_fwd', False, False): {0: Config(32, 32, 8, 2)},
    ('whole_fwd', False, True): {0: Config(32, 32, 2, 2)},
    ('whole_fwd', True, False): {0: Config(64, 32, 8, 2), **{cap: Config(32, 16, 8, 2) for cap in (86, 89, 90)}},
    ('whole_fwd', True, True): {0: Config(64, 32, 4, 2), 90: Config(64, 64, 4, 2)},
    # backward: the own tile (consecutive map tokens, keys or queries) is block_m, the other tokens' block_n. The
    # queries' programs also sum the corner table gradients.
    ('whole_bwd_q', False, False): {0: Config(16, 16, 4, 1)},
    ('whole_bwd_q', False, True): {0: Config(32, 16, 2, 1)},
    ('whole_bwd_q', True, False): {0: Config(64, 16, 8, 1), 90: Config(32, 16, 8, 1)},
    ('whole_bwd_q', True, True): {0: Config(64, 32, 4, 1), 120: Config(64, 16, 4, 1)},
    ('whole_bwd_kv', False, False): {0: Config(16, 16, 4, 1)},
    ('whole_bwd_kv', False, True): {0: Config(32, 32, 2, 1)},
    ('whole_bwd_kv', True, False): {0: Config(32, 16, 4, 1), 90: Config(32, 16, 8, 1)},
    ('whole_bwd_kv', True, True): {0: Config(64, 32, 4, 1), 90: Config(64, 64, 4, 1), 120: Config(64, 16, 4, 1)},
    ('line_fwd', False, False): {0: Config(32, 32, 8, 2)},
    # (sm_90: at most 168 registers per thread, so that 12 warps share an SM; the short row's 32 x 32 tiles over 2
    # warps take 255 under triton 3.6, where they spill 20-108 B within 168 at head dim 32: line.triton_impl)
    ('line_fwd', False, True): {0: Config(32, 32, 2, 2), 90: Config(32, 32, 2, 2, 168)},
    ('line_fwd', True, False): {0: Config(64, 32, 8, 2)},
    ('line_fwd', True, True): {0: Config(64, 64, 4, 2), 90: Config(64, 64, 4, 2, 168)},
    ('line_bwd', False, False): {0: Config(16, 16, 4, 1)},
    ('line_bwd', False, True): {0: Config(32, 32, 2, 1)},
    ('line_bwd', True, False): {0: Config(64, 16, 8, 1)},
    ('line_bwd', True, True): {0: Config(64, 64, 4, 1)},
    ('scan', False, False): {0: Config(32, 32, 4, 2)},
    ('scan', False, True): {0: Config(32, 32, 2, 2)},
    ('scan', True, False): {0: Config(64, 32, 8, 2)},
    ('scan', True, True): {0: Config(64, 64, 4, 2)},
    # PPMLA's fused kernels (linear/triton_impl.py): own tiles of one image row (block_m columns) against other
    # rows in chunks of block_n columns
    **{('ppmla_fwd', long, False): {0: Config(32, 32, 8, 2)} for long in (False, True)},
    **{('ppmla_fwd', long, True): {0: Config(64, 64, 4, 2)} for long in (False, True)},
    **{('ppmla_bwd', long, False): {0: Config(32, 16, 8, 1)} for long in (False, True)},
    **{('ppmla_bwd', long, True): {0: Config(64, 32, 4, 1), **{cap: Config(64, 16, 4, 1) for cap in (86, 89, 120)},
                                   90: Config(64, 32, 8, 1)} for long in (False, True)},
}


#: the families whose images narrower than NARROW take the narrow tiles (whole attention's backward)
NARROW_FAMILIES = ('whole_bwd_q', 'whole_bwd_kv')
KERNEL_FAMILIES = tuple(dict.fromkeys(family for family, _, _ in _TABLE))


def config(family: str, length: int, dtype: torch.dtype, cap: int, width: int = LARGE,
           head_dim: Optional[int] = None) -> Config:
    """Tiles, warps and stages of kernel ``family`` for sequences (or lines) of ``length`` tokens, of images
    ``width`` tokens wide (whole attention's backward), at ``head_dim`` (where :data:`LINE_LONG_BOUNDS` bound it)."""
    if cap == 0:
        chosen = _INTERPRETER
    elif narrow_tiles(family, length, dtype, cap, width):
        narrow = _NARROW[dtype != torch.float32]
        chosen = narrow.get(cap, narrow[0])
    else:
        row = _TABLE[(family, long_tiles(family, length, dtype, cap, head_dim), dtype != torch.float32)]
        chosen = row.get(cap, row[0])
    return dataclasses.replace(chosen, family=family)


#: the line families whose half-precision lines take the long row below LARGE tokens too (:func:`long_tiles`), and
#: the capabilities where they do
LINE_LONG = 48
LINE_LONG_CAPS = {'line_fwd': (80, 90), 'line_bwd': (80, 90)}
#: (family, capability) -> (the largest head dim, the shortest line) that take the long row there: sm_80's backward
#: spills on it at head dim 32 (8-788 B) and on lines of one block (56 tokens: 72-144 B), and at 32 x 32 over 2 warps
#: those lines are predicted no slower (tools/kernel_model.py)
LINE_LONG_BOUNDS = {('line_bwd', 80): (16, 65)}
#: whole attention's half-precision kernels on sm_80 and sm_90 take the long row from WHOLE_LONG tokens (two
#: 64-token tiles: maps of 14 x 14 and 16 x 16; the backward on narrow images too): per real score its tiles over 4
#: warps issue less than the short row's 16 or 32 own tokens over 2 warps, though they pad more (7 x 7 maps keep the
#: short row: 64 own tokens pad them to 29% real scores in the backward)
WHOLE_FAMILIES = ('whole_fwd', 'whole_bwd_q', 'whole_bwd_kv')
WHOLE_LONG = 128
WHOLE_LONG_CAPS = (80, 90)


def narrow_tiles(family: str, length: int, dtype: torch.dtype, cap: int, width: int) -> bool:
    """Whether ``family`` takes the narrow images' tiles on an image ``width`` tokens wide of ``length`` tokens: whole
    attention's backward on images narrower than NARROW, but for the maps of fewer than NARROW² tokens (no taller
    than NARROW) that :func:`long_tiles` puts on the long row."""
    if width >= NARROW or family not in NARROW_FAMILIES:
        return False
    return not (length < NARROW * NARROW and long_tiles(family, length, dtype, cap))


def long_tiles(family: str, length: int, dtype: torch.dtype, cap: int, head_dim: Optional[int] = None) -> bool:
    """Whether ``family`` takes its table's long row for ``length`` tokens on capability ``cap``: at LARGE tokens or
    more, and (LINE_LONG_CAPS) the criss-cross kernels' half-precision lines of LINE_LONG or more that the long row's
    64 own tokens pad no more than the short row's 32 (lines of 56, 100 or 168 tokens; not 200 or 336), within
    LINE_LONG_BOUNDS (a ``head_dim`` of None is outside them): per score the 64 x 64 tiles over 4 warps issue less
    than 32 x 32 over 2 (tools/kernel_model.py); and (sm_80, sm_90) whole attention's half-precision kernels from
    WHOLE_LONG tokens."""
    if length >= LARGE:
        return True
    if dtype == torch.float32:
        return False
    if family in WHOLE_FAMILIES:
        return cap in WHOLE_LONG_CAPS and length >= WHOLE_LONG
    if (family, cap) in LINE_LONG_BOUNDS:
        most_d, least = LINE_LONG_BOUNDS[(family, cap)]
        if head_dim is None or head_dim > most_d or length < least:
            return False
    return (cap in LINE_LONG_CAPS.get(family, ()) and length >= LINE_LONG
            and cdiv(length, 64) * 64 == cdiv(length, 32) * 32)


def table_configs(cap: int) -> FrozenSet[Config]:
    """Every distinct configuration :func:`config` can return for capability ``cap``: per family, short and long
    sequences, each dtype, and the narrow images' tiles."""
    return frozenset(config(family, length, dtype, cap, width) for family in KERNEL_FAMILIES for length in (1, LARGE)
                     for dtype in (torch.float32, torch.float16, torch.bfloat16)
                     for width in ((NARROW - 1, LARGE) if family in NARROW_FAMILIES else (LARGE, )))


@dataclasses.dataclass
class Launch:
    """One kernel launch: positional run-time arguments (tensors, ints, floats), constexprs, grid, config.
    Tensors may live on the ``meta`` device: then the launch is only described (for compiling it elsewhere)."""
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    constexprs: Dict[str, Any]
    config: Config
    #: the device of the launch's tensors (default: its first tensor argument's)
    device: Optional[torch.device] = None

    def __post_init__(self) -> None:
        if self.device is None:
            self.device = next((a.device for a in self.args if isinstance(a, torch.Tensor)), torch.device('meta'))
        grid = self.grid
        if len(grid) > 3 or grid[0] > GRID_LIMITS[0] or (len(grid) > 1 and max(grid[1:]) > GRID_LIMITS[1]):
            self.check_grid()

    def check_grid(self) -> None:
        """Raise :class:`LaunchLimitError` if the grid exceeds CUDA's limits."""
        if len(self.grid) > len(GRID_LIMITS) or any(n > limit for n, limit in zip(self.grid, GRID_LIMITS)):
            raise LaunchLimitError(f'{self.name}: grid {self.grid} exceeds CUDA\'s limits ('
                                   f'{", ".join(map(str, GRID_LIMITS))} programs along axes 0, 1, 2)')

    def __call__(self) -> None:
        config = self.config
        if self.device.type == 'cpu':
            with exact_bf16_dots():
                self.kernel[self.grid](*self.args, **self.constexprs, num_warps=config.num_warps,
                                       num_stages=config.num_stages, maxnreg=config.maxnreg)
        else:
            self.kernel[self.grid](*self.args, **self.constexprs, num_warps=config.num_warps,
                                   num_stages=config.num_stages, maxnreg=config.maxnreg)

    def prepare(self, device: torch.device) -> None:
        """Compile for ``device`` and load the binary, without launching: raises what a launch would
        (``OutOfResources`` when the shared memory exceeds the device's, a ``CompilationError``...), and
        :class:`KernelLoadError` when the driver cannot load it. Nothing to do on the simulated device (CPU
        tensors): ``tools/check_kernels.py`` compiles its launches ahead of time."""
        if device.type != 'cuda':
            return
        with torch.cuda.device(device):
            compiled = self.kernel.warmup(*self.args, grid=self.grid, **self.constexprs, **self.options)
            try:
                compiled._init_handles()
            except RuntimeError as e:
                if isinstance(e, (torch.OutOfMemoryError, torch.AcceleratorError)):
                    raise
                # an error left by an earlier kernel also surfaces here: synchronizing raises it as the CUDA error
                # it is, instead of blaming this kernel
                torch.cuda.synchronize(device)
                raise KernelLoadError(f'{self.name}: the driver cannot load the compiled kernel: {e}') from e

    @property
    def options(self) -> Dict[str, int]:
        """Compile options of the launch."""
        return dict(num_warps=self.config.num_warps, num_stages=self.config.num_stages, maxnreg=self.config.maxnreg)

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__ if hasattr(self.kernel, 'fn') else self.kernel.__name__

    def signature(self) -> Tuple[Dict[str, str], Dict[Tuple[int], list]]:
        """(signature, attrs) for ``triton.compiler.ASTSource``, specialized as the JIT launcher does: tensors
        by dtype and 16-byte alignment, integers by divisibility by 16 (but those the kernel does not specialize)."""
        names = [n for n in self.kernel.arg_names if n not in self.constexprs]
        loose = _unspecialized(self.kernel)
        if len(names) != len(self.args):
            raise ValueError(f'{self.name}: {len(self.args)} run-time arguments for parameters {names}')
        signature, attrs = {}, {}
        for name, value in zip(names, self.args):
            index = (self.kernel.arg_names.index(name), )
            if isinstance(value, torch.Tensor):
                signature[name] = '*' + _TRITON_DTYPE[value.dtype]
                if value.storage_offset() * value.element_size() % 16 == 0:  # allocations are 16-byte aligned
                    attrs[index] = [['tt.divisibility', 16]]
            elif isinstance(value, bool):
                signature[name] = 'i1'
            elif isinstance(value, int):
                signature[name] = 'i32' if -2**31 <= value < 2**31 else 'i64'
                if value % 16 == 0 and name not in loose:
                    attrs[index] = [['tt.divisibility', 16]]
            elif isinstance(value, float):
                signature[name] = 'fp32'
            else:
                raise TypeError(f'{self.name}: argument {name} of type {type(value).__name__}')
        for name in self.constexprs:
            signature[name] = 'constexpr'
        return signature, attrs


def _unspecialized(kernel) -> set:
    """The names of the kernel's parameters it does not specialize on (``do_not_specialize``; the interpreter's
    functions keep the list in their keyword arguments)."""
    if hasattr(kernel, 'params'):
        return {p.name for p in kernel.params if p.do_not_specialize}
    return {kernel.arg_names[n] if isinstance(n, int) else n for n in kernel.kwargs.get('do_not_specialize') or ()}


_TRITON_DTYPE = {torch.float32: 'fp32', torch.float16: 'fp16', torch.bfloat16: 'bf16', torch.int32: 'i32',
                 torch.int64: 'i64'}


_RECORDING: List[Tuple[int, List[Launch]]] = []
_EXECUTED: List[Set[Tuple[int, Config]]] = []


def run(launches) -> None:
    """Launch each of ``launches`` on its tensors' device (the current CUDA device is the process's, not the
    inputs'); inside :func:`recording`, append them to its list instead; inside :func:`executed`, also note their
    (capability, configuration)."""
    if _RECORDING:
        _RECORDING[-1][1].extend(launches)
        return
    for launch in launches:
        device = launch.device
        if device.type == 'cuda':
            with torch.cuda.device(device):
                launch()
        else:
            launch()
        for ran in _EXECUTED:
            ran.add((device_capability(device), launch.config))


@contextlib.contextmanager
def executed() -> Iterator[Set[Tuple[int, Config]]]:
    """Within the block, every launch that runs adds its (capability, configuration) to the yielded set."""
    ran: Set[Tuple[int, Config]] = set()
    _EXECUTED.append(ran)
    try:
        yield ran
    finally:
        _EXECUTED.pop()


def is_recording() -> bool:
    """Whether the ops record their launches (inside :func:`recording`) instead of running them."""
    return bool(_RECORDING)


@contextlib.contextmanager
def recording(cap: int) -> Iterator[List[Launch]]:
    """Within the block, the ops choose launch parameters for compute capability ``cap`` and record their
    launches in the yielded list without running them (with ``meta`` tensors the ops run without data)."""
    launches: List[Launch] = []
    _RECORDING.append((cap, launches))
    try:
        yield launches
    finally:
        _RECORDING.pop()


def library_op(name: str, fn: Callable, shapes: Callable) -> Callable:
    """``fn`` (which makes its launches and hands them to :func:`run`) as the ``torch.library`` op
    ``mmppma::<name>``: ``torch.compile`` sees one node. Its fake implementation allocates the outputs
    (``shapes``, same arguments); inside :func:`recording` it runs ``fn`` on the ``meta`` tensors instead, so that
    the launches are recorded as the op makes them."""
    op = torch.library.custom_op(f'mmppma::{name}', fn, mutates_args=())
    op.register_fake(lambda *args: fn(*args) if _RECORDING else shapes(*args))
    return op
