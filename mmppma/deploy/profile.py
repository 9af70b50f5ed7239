"""Where an ONNX file spends its onnxruntime (CPU) time: the profiler's kernel times of one run, summed by
op type and by the part of the model each node came from (:func:`profile_onnx`). docs/deployment.md."""
import ast
import collections
import json
import os
import tempfile
from typing import Dict, NamedTuple, Optional

import numpy as np

from .runtime import onnx_session

#: the part of the nodes onnxruntime's graph optimizer adds (layout reorders around its blocked-format
#: convolutions, reshapes around Gemm, ...), which no exported node names
INSERTED = 'added by onnxruntime'


#: the op types whose nodes run subgraphs: the profiler times each subgraph node too, so the container's own time,
#: which holds theirs, is left out of the sums
CONTAINERS = ('Scan', 'Loop', 'If')


class Profile(NamedTuple):
    """Kernel seconds of one run (``total``) by op type (``ops``, onnxruntime's types after its fusions) and by
    model part (``parts``, :func:`node_parts`), each sorted by time, largest first."""
    total: float
    ops: Dict[str, float]
    parts: Dict[str, float]


def node_parts(path: str, depth: int = 2) -> Dict[str, str]:
    """The part of the model each node of the ONNX file and each value it computes came from, from the
    metadata ``torch.onnx.export(dynamo=True)`` writes: the module at ``depth`` in its module path (e.g.
    ``model.backbone.layers.0`` at 2, ``model.neck`` at 1, or the deepest module above it), else, for a node of
    the exported module's own code, the innermost function of its stack trace (``_offset_nms``). The nodes of a
    ``Scan``'s, ``Loop``'s or ``If``'s subgraphs take the part of that node."""
    import onnx
    parts = {}

    def walk(graph, container_part: Optional[str]) -> None:
        for node in graph.node:
            part = container_part or _own_part(node, depth)
            for name in (node.name, *node.output):
                parts[name] = part
            for attribute in node.attribute:  # the subgraphs of Scan, Loop and If: the part of their node
                for subgraph in (*([attribute.g] if attribute.HasField('g') else []), *attribute.graphs):
                    walk(subgraph, part)

    walk(onnx.load(path, load_external_data=False).graph, None)
    return parts


def _own_part(node, depth: int) -> str:
    meta = {p.key: p.value for p in node.metadata_props}
    modules = ast.literal_eval(meta.get('pkg.torch.onnx.name_scopes', '[]'))[1:-1]
    if modules:
        return modules[min(depth, len(modules)) - 1]
    frames = [line for line in meta.get('pkg.torch.onnx.stack_trace', '').splitlines() if ', in ' in line]
    return frames[-1].rsplit(', in ', 1)[1] + '()' if frames else '(no module)'


def _part(name: str, parts: Dict[str, str]) -> str:
    """The part of a node in onnxruntime's optimized graph: its own name's, or that of the node or value its fused
    name is made from (``fused <name>``, ``<name>/<fusion>/``, ``<value>_nchwc``)."""
    base = name.replace('fused ', '', 1).split('/')[0]
    for candidate in (name, base, base.removesuffix('_nchwc'), 'node_' + base.removesuffix('_nchwc')):
        if candidate in parts:
            return parts[candidate]
    return INSERTED


def profile_onnx(path: str, feed: Dict[str, np.ndarray], threads: Optional[int] = None, runs: int = 2,
                 depth: int = 2) -> Profile:
    """onnxruntime's profile of the file's last of ``runs`` runs on ``feed`` (the first runs warm it up), on
    ``threads`` intra-op threads (:func:`~mmppma.deploy.runtime.onnx_session`): :class:`Profile` (parts at
    ``depth``, :func:`node_parts`)."""
    with tempfile.TemporaryDirectory() as workdir:
        session = onnx_session(path, threads=threads, profile=os.path.join(workdir, 'profile'))
        for _ in range(runs):
            session.run(None, feed)
        with open(session.end_profiling()) as file:
            events = json.load(file)
    last = [e for e in events if e.get('cat') == 'Session' and e['name'] == 'model_run'][-1]
    parts = node_parts(path, depth)
    ops, by_part = collections.Counter(), collections.Counter()
    for event in events:
        if (event.get('cat') == 'Node' and event['name'].endswith('_kernel_time')
                and event['args']['op_name'] not in CONTAINERS
                and last['ts'] <= event['ts'] <= last['ts'] + last['dur']):
            seconds = event['dur'] / 1e6
            ops[event['args']['op_name']] += seconds
            by_part[_part(event['name'].removesuffix('_kernel_time'), parts)] += seconds
    return Profile(sum(ops.values()), dict(ops.most_common()), dict(by_part.most_common()))
