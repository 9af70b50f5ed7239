#!/usr/bin/env python
"""Convert an official VMINet release checkpoint (yws-wxs/VMINet) to mmppma's layout.

    python tools/model_converters/vminet_official_to_mmppma.py SRC DST [--arch ti|xs|s|b] [--backbone-only]
        [--backbone-out PATH] [--key KEY] [--config CONFIG] [--allow-pickle]

Classification checkpoints (timm's ``state_dict``; ``state_dict_ema`` with ``--key``) become a full mmpretrain
ImageClassifier state for ``configs/vminet_<arch>_8xb128_in1k.py``: ``backbone.*`` (the final BatchNorm
``norm`` as ``backbone.norm3``) + ``head.fc.*``. Both release layouts are read: revision 6b11d4a (blocks'
``dwconv``, BatchNorm after ``g``) as is, revision 7c2632c (``conv``, no BatchNorm after ``g``) with ``conv.``
renamed to ``dwconv.``; the latter needs ``model.backbone.proj_norm=False`` (printed). ``backbone.``-prefixed
checkpoints keep their other keys. ``--backbone-only`` writes only ``backbone.*`` keys, for
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``; ``--backbone-out`` writes that file
in addition to DST. The arch is detected from the shapes unless given; every key and shape is checked
against the model built from the config; any missing, unexpected or mis-shaped key is an error that lists
them. timm checkpoints pickle the training args: pass ``--allow-pickle`` for a file you trust.
"""
import sys

from release_converter_cli import main

if __name__ == '__main__':
    sys.exit(main('VMINet', __doc__))
