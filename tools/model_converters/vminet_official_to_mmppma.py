#!/usr/bin/env python
"""Convert an official VMINet release checkpoint (yws-wxs/VMINet, ``vminet.py`` at commit 6b11d4a or 7c2632c)
to mmppma's layout.

    python tools/model_converters/vminet_official_to_mmppma.py SRC DST [--arch ti|xs|s|b] [--backbone-only]
        [--backbone-out PATH] [--key KEY] [--config CONFIG] [--allow-pickle]

Two steps reproduce the release's outputs:

1. Convert: ``python tools/model_converters/vminet_official_to_mmppma.py SRC DST``. The release revision is
   detected from the checkpoint's keys: blocks' ``dwconv`` with ``g.bn`` keys is revision 6b11d4a (no context
   mask: ``context_mask='none', proj_norm=True``); blocks' ``conv`` without ``g.bn`` is revision 7c2632c (the
   'tril' context mask: ``context_mask='tril', proj_norm=False``). The converter prints the config for that
   revision and size on a line of its own, ``config: configs/vminet_<arch>_release-<revision>_in1k.py``.
2. Load with that config: ``mmpretrain.apis.init_model('configs/vminet_<arch>_release-<revision>_in1k.py',
   DST)`` (the converter prints this line too).

DST records the revision and its options (``meta['mmppma_vminet_release']`` and the state dict's load
metadata); loading it into a VMINet whose ``context_mask`` or ``proj_norm`` differs is an error naming the
option to set, through ``init_model`` / ``load_checkpoint`` and through ``init_cfg=dict(type='Pretrained',
prefix='backbone.')`` alike.

Classification checkpoints (timm's ``state_dict``; ``state_dict_ema`` with ``--key``) become a full mmpretrain
ImageClassifier state: ``backbone.*`` (the final BatchNorm ``norm`` as ``backbone.norm3``; revision 7c2632c's
``conv.`` renamed ``dwconv.``) + ``head.fc.*``. ``backbone.``-prefixed checkpoints keep their other keys.
``--backbone-only`` writes only ``backbone.*`` keys, for ``init_cfg=dict(type='Pretrained', checkpoint=DST,
prefix='backbone.')`` in a backbone with the revision's options (printed); ``--backbone-out`` writes that file
in addition to DST. The arch is detected from the shapes unless given; every key and shape is checked against
the model built from the config (``--config`` must have the revision's options); any missing, unexpected or
mis-shaped key is an error that lists them. timm checkpoints pickle the training args: pass
``--allow-pickle`` for a file you trust.
"""
import sys

from release_converter_cli import main

if __name__ == '__main__':
    sys.exit(main('VMINet', __doc__))
