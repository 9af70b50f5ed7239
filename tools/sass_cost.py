"""What one iteration of a compiled kernel's key loop issues: the SASS of a cubin (``cuobjdump -sass``, shipped
with Triton's NVIDIA backend; no GPU needed), its innermost loop that holds matrix-multiply instructions, and that
loop's instructions by class. Used by ``tools/check_kernels.py --sass``.

A loop is the span from a backward branch's target to the branch (``@P0 BRA 0x..``, or sm_100's ``BRA.U !UP0, 0x..``
with the predicate as an operand). The key loop is an innermost span holding an MMA (HMMA for warp-level
products, sm_80 to sm_120; HGMMA for sm_90's warp-group products; UTCHMMA for sm_100's tensor-memory products, whose
barrier waits retry in stubs after the kernel's body that branch back into the loop and are not counted): the loop
over the other tokens' blocks in every attention kernel here; where a kernel has several such loops that hold no
other (one per map, role or range of key rows it can run), the longest. Exact float32 products run on the FMA units,
unrolled: a kernel without MMAs takes its longest loop; a kernel whose MMAs are in no loop, its code up to its last
EXIT (one iteration per program). A loop inside the key loop (whole attention's backward keeps its corner rows in
one) counts once, as laid out: such a row's count is a lower bound of what an iteration issues, and ``inner`` says
how many there are. Its instructions are counted as laid out (each once: a predicated-off or
branched-over instruction counts too), per warp, except sm_100's paired float32 instructions (FADD2, FMUL2, FFMA2),
which count as the two they stand for: they save issue slots, not float32 work, so that the same arithmetic is
priced alike on every target.
"""
import os
import re
import subprocess
import tempfile
from collections import Counter
from typing import Dict, List, Optional, Tuple

import triton

CLASSES = ('mma', 'fp32', 'mufu', 'conv', 'int', 'mem', 'other')
#: what :func:`loop_cost` counts: check_kernels prices a cached row again when its pricing differs
PRICING = 7
#: instructions that count as more than one: sm_100's paired float32 operations
WEIGHTS = {'FADD2': 2, 'FMUL2': 2, 'FFMA2': 2}
# opcode (before the first '.') -> class; what no rule names is 'other' (moves, shuffles, predicates, barriers,
# branches, NOPs)
_RULES = (
    ('mma', r'HMMA|HGMMA|IMMA|IGMMA|DMMA|BMMA|QMMA|OMMA|UTCHMMA'),
    ('mufu', r'MUFU'),
    ('conv', r'F2F|F2FP|F2I|I2F|I2FP|I2I|FRND|F2IP'),
    ('fp32', r'FADD|FMUL|FFMA|FMNMX|FSEL|FSET|FSETP|FCHK|FSWZADD|FADD32I|FMUL32I|FFMA32I|HADD2|HMUL2|HFMA2|HMNMX2'
             r'|HSET2|HSETP2|FMNMX3|FADD2|FMUL2|FFMA2|DADD|DMUL|DFMA'),
    ('int', r'IMAD|IADD|IADD3|IADD32I|IMUL|IMUL32I|LOP|LOP3|LOP32I|SHF|SHL|SHR|ISETP|ISET|LEA|LEA_HI|IMNMX|IABS|SEL'
            r'|POPC|FLO|BREV|BMSK|SGXT|PRMT|VIADD|VIMNMX|VIMNMX3|IDP|IDP4A|UIMAD|UIADD3|ULOP3|USHF|UISETP|ULEA|USEL|UIMNMX'),
    ('mem', r'LDG|STG|LDS|STS|LDSM|STSM|LDGSTS|LDGDEPBAR|LD|ST|LDL|STL|ATOM|ATOMS|ATOMG|RED|LDC|LDCU|ULDC|UTMALDG'
            r'|LDTM|STTM|UTMASTG|UBLKCP|LDTRAM|CCTL|MATCH'),
)
_CLASS = {op: cls for cls, ops in _RULES for op in ops.split('|')}
_LINE = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);')


def cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')


def sass_text(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([cuobjdump(), '-sass', f.name], capture_output=True, text=True, check=True).stdout


def disassemble(cubin: bytes) -> List[Tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction of the cubin's kernel, in address order."""
    return parse(sass_text(cubin))


def parse(text: str) -> List[Tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction of ``cuobjdump -sass`` output, in address order."""
    return [(int(m.group(1), 16), m.group(2), m.group(4).strip()) for m in _LINE.finditer(text)]


def modifiers(text: str) -> List[str]:
    """What follows the opcode of every instruction of ``cuobjdump -sass`` output ('.16816.F32.BF16 R4, ...'; sm_90's
    '.64x64x16' shapes, lower case, run on into the operands), as :func:`parse` orders them."""
    return [m.group(3) + m.group(4) for m in _LINE.finditer(text)]


def tensor_fmas(opcode: str, modifier: str) -> float:
    """Multiply-adds per warp of one tensor-core instruction: HMMA.MNK (a warp's product: '16816' is m16 n8 k16,
    '1688' m16 n8 k8) and HGMMA.MxNxK (a warp group's: a quarter per warp); 0 for what names no shape (sm_100's
    UTCHMMA keeps its shape in a descriptor register)."""
    if opcode == 'HGMMA':
        shape = re.match(r'\.(\d+)x(\d+)x(\d+)', modifier)
        return int(shape.group(1)) * int(shape.group(2)) * int(shape.group(3)) / 4 if shape else 0.0
    if opcode in ('HMMA', 'IMMA', 'DMMA'):
        shape = re.match(r'\.(16)(8)(16|8|4|32)\b', modifier) or re.match(r'\.(8)(8)(4)\b', modifier)
        return int(shape.group(1)) * int(shape.group(2)) * int(shape.group(3)) if shape else 0.0
    return 0.0


def classify(opcode: str) -> str:
    return _CLASS.get(opcode, 'other')


def loops(instructions: List[Tuple[int, str, str]]) -> List[Tuple[int, int]]:
    """(first, last) instruction index of every loop: a backward branch and its target."""
    address = [a for a, _, _ in instructions]
    spans = []
    for index, (at, opcode, operands) in enumerate(instructions):
        # the target is the last operand: 'BRA 0x10b0', 'BRA `(.L_x_3) 0x10b0', 'BRA.U !UP0, 0x10b0' (sm_100's
        # uniform-predicated branch)
        target = re.search(r'(0x[0-9a-f]+)\s*$', operands) if opcode == 'BRA' else None
        if target and int(target.group(1), 16) <= at:
            first = address.index(int(target.group(1), 16)) if int(target.group(1), 16) in address else None
            if first is not None:
                spans.append((first, index))
    return spans


def key_loop(instructions: List[Tuple[int, str, str]]) -> Optional[Tuple[int, int]]:
    """(first, last) instruction index of the innermost loop holding an MMA (no such loop inside it), the longest
    of them where a kernel has several (one per map, role or range of key rows), else (a kernel without MMAs) of the
    longest loop (see the module docstring); None if there is no such loop."""
    innermost = key_loops(instructions)
    if innermost:
        return innermost[0]
    if any(classify(op) == 'mma' for _, op, _ in instructions):  # products outside any loop: no key loop
        return None
    spans = [(a, b) for a, b in loops(instructions) if all(op != 'EXIT' for _, op, _ in instructions[a:b + 1])]
    return max(spans, key=lambda span: span[1] - span[0]) if spans else None


def key_loops(instructions: List[Tuple[int, str, str]]) -> List[Tuple[int, int]]:
    """Every innermost loop holding an MMA (:func:`key_loop`'s candidates), longest first."""
    # a span reaching past the kernel's end (an EXIT inside) is a retry stub's branch back, not a loop
    spans = [(a, b) for a, b in loops(instructions) if all(op != 'EXIT' for _, op, _ in instructions[a:b + 1])]
    products = [(a, b) for a, b in spans if any(classify(op) == 'mma' for _, op, _ in instructions[a:b + 1])]
    innermost = [(a, b) for a, b in products
                 if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in products)]
    return sorted(innermost, key=lambda span: span[0] - span[1])


def _span_cost(instructions, shapes, first: int, last: int) -> Dict[str, float]:
    """Instructions of the span per class (:data:`WEIGHTS` applied), their total as 'all' and the tensor-core
    multiply-adds per warp as 'tensor'."""
    counts = Counter()
    tensor = 0.0
    for (_, op, _), modifier in zip(instructions[first:last + 1], shapes[first:last + 1]):
        counts[classify(op)] += WEIGHTS.get(op, 1)
        tensor += tensor_fmas(op, modifier)
    cost = {cls: counts.get(cls, 0) for cls in CLASSES}
    cost['all'] = sum(counts.values())
    cost['tensor'] = tensor
    return cost


def loop_cost(cubin: bytes) -> Dict[str, int]:
    """Instructions of one key-loop iteration per class (per warp, :data:`WEIGHTS` applied), their total as
    'all', the tensor-core multiply-adds per warp as 'tensor' (:func:`tensor_fmas`), the loops inside it as
    'inner', and :data:`PRICING`; where the kernel has several key loops, the next longest's counts as 'side'
    (whole attention's forward: the key rows above and below the query tile, the key loop being the one between
    them)."""
    text = sass_text(cubin)
    instructions, shapes = parse(text), modifiers(text)
    span = key_loop(instructions)
    # a kernel whose products are in no loop (straight-line code; the branch to itself past EXIT is no key loop):
    # its code to its last EXIT, once
    exits = [index for index, (_, op, _) in enumerate(instructions) if op == 'EXIT']
    first, last = span if span else (0, exits[-1] if exits else len(instructions) - 1)
    cost = _span_cost(instructions, shapes, first, last)
    cost['inner'] = sum(first <= a and b <= last and (a, b) != (first, last) for a, b in loops(instructions))
    others = key_loops(instructions)[1:]
    if span and others:
        cost['side'] = _span_cost(instructions, shapes, *others[0])
    cost['pricing'] = PRICING
    return cost


def mma_count(cubin: bytes) -> int:
    """Matrix-multiply (tensor-core) instructions anywhere in the cubin's kernel."""
    return sum(classify(op) == 'mma' for _, op, _ in disassemble(cubin))
