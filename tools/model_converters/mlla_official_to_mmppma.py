#!/usr/bin/env python
"""Convert an official MLLA release checkpoint (LeapLabTHU/MLLA, ``models/mlla.py`` at commit 5a17196 with
``cfgs/mlla_{t,s,b}.yaml``; one key layout) to mmppma's layout.

    python tools/model_converters/mlla_official_to_mmppma.py SRC DST [--arch t|s|b] [--backbone-only]
        [--backbone-out PATH] [--key KEY] [--config CONFIG] [--allow-pickle]

Two steps: convert (this script; it prints the config on a line of its own, ``config:
configs/mlla_<arch>_8xb128_in1k.py``), then load with ``mmpretrain.apis.init_model(CONFIG, DST)``.

Classification checkpoints (state under ``model``; ``state_dict_ema`` with ``--key``) become a full mmpretrain
ImageClassifier state for ``configs/mlla_<arch>_8xb128_in1k.py``: ``backbone.*`` (the final ``norm`` as
``backbone.norm3``) + ``head.fc.*``; the release's fixed RoPE buffers (``*.attn.rope.rotations``) are dropped
(mmppma computes RoPE per input size). Downstream checkpoints (``backbone.`` prefix, ``norm0``-``norm3``) keep
their detector / segmentor keys. ``--backbone-only`` writes only ``backbone.*`` keys, for
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``; ``--backbone-out`` writes that file
in addition to DST. The arch is detected from the shapes unless given; every key and shape is checked
against the model built from the config; any missing, unexpected or mis-shaped key is an error that lists
them. The release files pickle their training config: pass ``--allow-pickle`` for a file you trust.
"""
import sys

from release_converter_cli import main

if __name__ == '__main__':
    sys.exit(main('MLLA', __doc__))
