"""VMINet backbone (Vision Mamba Inspired Separable Self-Attention; docs/method.md §10), registered once for
mmpretrain, mmdet and mmseg: a ConvBN stem and four stages of VMI-SA blocks, module names as the release's, any
input size, NCHW outputs at strides 4..32. Release revisions, figures and our choices: docs/vminet.md.
"""
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.registry import register_model

from ..layers.conv import ConvBN
from ..layers.vminet import VMINET_CONTEXT_MASKS, VMISABlock, VMIStage, stage_sizes
from .base import StagedBackbone, check_choice, resolve_arch_settings
from .release import read_release_record

#: Where a converted checkpoint records its release revision and options: ``state_dict._metadata[prefix]``
#: (torch's per-module load metadata, which mmengine's ``load_checkpoint`` keeps) and the checkpoint's ``meta``.
RELEASE_RECORD = 'mmppma_vminet_release'

_DEPTHS = [2, 2, 18, 2]  # the release: every size has 24 blocks, as Vim's 24 Mamba blocks


def _size(base_dim: int, mlp_ratio: int) -> dict:
    return dict(
        embed_dims=[base_dim * 2**i for i in range(4)], depths=list(_DEPTHS), mlp_ratios=[mlp_ratio] * 4)


#: The one architecture table (release ``vminet_{Ti,XS,S,B}``: base_dim, mlp_ratio; paper Table 1: C, k).
ARCH_ZOO: Dict[str, dict] = {
    **dict.fromkeys(['ti', 'tiny'], _size(24, 2)),
    **dict.fromkeys(['xs', 'xsmall'], _size(48, 2)),
    **dict.fromkeys(['s', 'small'], _size(48, 4)),
    **dict.fromkeys(['b', 'base'], _size(96, 2)),
}

REQUIRED_KEYS = ('embed_dims', 'depths', 'mlp_ratios')
OPTIONAL_KEYS = ('stem_channels', 'kernel_size')
DEFAULTS = dict(stem_channels=32, kernel_size=7)
OUT_NORMS = ('LN', 'BN')

_BLOCK_KEY = re.compile(r'stages\.\d+\.[1-9]\d*\.(conv|dwconv|g)\.(bn\.)?')


def resolve_arch(arch: Union[str, dict]) -> dict:
    """A named arch ('ti'/'tiny', 'xs'/'xsmall', 's'/'small', 'b'/'base', any case) or a custom dict -> a
    full, checked settings dict (a copy). Raises ``ValueError``/``TypeError`` naming the valid choices."""
    arch = {**DEFAULTS, **resolve_arch_settings(arch, ARCH_ZOO, 'VMINet', REQUIRED_KEYS, OPTIONAL_KEYS)}
    if arch['kernel_size'] % 2 == 0:
        raise ValueError(f'custom VMINet arch dict: kernel_size must be odd; got {arch["kernel_size"]}')
    return arch


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2).contiguous()


@register_model
class VMINet(StagedBackbone):
    """VMINet (Vision Mamba Inspired Separable Self-Attention network), for classification and dense prediction.

    Args:
        arch: 'ti' | 'xs' | 's' | 'b' (or 'tiny' | 'xsmall' | 'small' | 'base'), or a dict with keys
            embed_dims, depths, mlp_ratios (per stage) and optionally stem_channels (32), kernel_size (7).
        in_channels: image channels.
        img_size: the (pre)training image size; fixes the size of the context weight tables (224 -> 56, 28,
            14, 7 tokens). Other input sizes resize the tables (see the module docstring).
        context_mask: the context vector's mask, 'tril' (paper Eq. 10, default) or 'none'.
        proj_norm: BatchNorm after each block's output projection (release revision 6b11d4a; default True).
        out_norm: per-output norm: 'LN' (``outnorm{i}``, channel LayerNorm, eps 1e-6; also ``True``), 'BN'
            (``norm{i}``, BatchNorm2d: the release classifier's norm), or None / False.
        **kwargs: the keywords every backbone shares (keyword only), documented in :class:`StagedBackbone`:
            drop_path_rate, out_indices, frozen_stages, norm_eval, with_cp, init_cfg, pretrained. With
            ``with_cp``, BatchNorm statistics inside a checkpointed block are updated again on recomputation, as
            in mmcv's ResNet ``with_cp``. Without ``init_cfg`` the release init applies at construction
            (Linear-style context weights trunc_normal .02, BatchNorm 1 / 0, ``stack`` 1, convs PyTorch default).

    Outputs: tuple of (B, C_i, ceil(H / 2^(i+2)), ceil(W / 2^(i+2))) for i in out_indices.
    """
    arch_zoo = ARCH_ZOO
    stem_name = 'stem'
    stages_name = 'stages'
    channels_last_stages = False

    def __init__(self,
                 arch: Union[str, dict] = 'xs',
                 in_channels: int = 3,
                 img_size: Union[int, Sequence[int]] = 224,
                 context_mask: str = 'tril',
                 proj_norm: bool = True,
                 *,
                 out_norm: Union[str, bool, None] = 'LN',
                 **kwargs) -> None:
        check_choice('context_mask', context_mask, VMINET_CONTEXT_MASKS)
        out_norm = self._check_out_norm(out_norm)
        super().__init__(resolve_arch(arch), in_channels, **kwargs)
        s = self.arch_settings
        self.context_mask, self.proj_norm, self.out_norm = context_mask, proj_norm, out_norm
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)

        stem_channels = s['stem_channels']
        self.stem = nn.Sequential(ConvBN(in_channels, stem_channels, 3, stride=2), nn.ReLU6())
        self.stages = nn.ModuleList()
        for i, (size, drop_paths) in enumerate(zip(stage_sizes(self.img_size, self.num_stages), self.drop_paths)):
            dims = self.embed_dims[i]
            downsample = ConvBN(self.embed_dims[i - 1] if i else stem_channels, dims, 3, stride=2)
            blocks = [
                VMISABlock(dims, s['mlp_ratios'][i], size, context_mask, proj_norm, s['kernel_size'], p)
                for p in drop_paths
            ]
            self.stages.append(VMIStage(downsample, blocks, self.with_cp))
        if out_norm == 'BN':
            self._add_out_norms(lambda i: nn.BatchNorm2d(self.embed_dims[i]))
        elif out_norm == 'LN':
            self._add_out_norms(lambda i: ChannelLayerNorm(self.embed_dims[i], eps=1e-6))
        self._freeze_stages()

    def out_norm_name(self, i: int) -> str:
        """``norm{i}`` (BatchNorm) or ``outnorm{i}`` (LayerNorm): different names for different layers, so a
        classification checkpoint's ``norm3`` never loads into a dense backbone's LayerNorm."""
        return f'norm{i}' if self.out_norm == 'BN' else f'outnorm{i}'

    @staticmethod
    def _check_out_norm(out_norm: Union[str, bool, None]) -> Optional[str]:
        if out_norm is True:
            return 'LN'
        if out_norm is None or out_norm is False:
            return None
        if isinstance(out_norm, str) and out_norm.upper() in OUT_NORMS:
            return out_norm.upper()
        raise ValueError(f'out_norm={out_norm!r}; choose one of {", ".join(map(repr, OUT_NORMS))}, True (= \'LN\') '
                         f'or None / False')

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of NCHW features, one per ``out_indices``."""
        return tuple(self.forward_stages(x, self.out_indices))

    def check_release_record(self, record: Mapping) -> None:
        """record: a converted release checkpoint's ``RELEASE_RECORD`` (revision, context_mask, proj_norm).
        Raises ``ValueError`` naming the options to set when they differ from this backbone's."""
        if 'mask' in record:
            raise ValueError(f'a VMINet release record {dict(record)} names the context mask "mask"; reconvert the '
                             'release checkpoint with tools/model_converters/release_to_mmppma.py --family VMINet, '
                             'whose record names it context_mask')
        wrong = [k for k in ('context_mask', 'proj_norm') if k in record and record[k] != getattr(self, k)]
        if wrong:
            revision = record.get('revision')
            need = ', '.join(f'{k}={record[k]!r}' for k in wrong)
            raise ValueError(f'this VMINet checkpoint was converted from the release revision {revision}, whose '
                             f'blocks need {need}; this backbone has '
                             f'{", ".join(f"{k}={getattr(self, k)!r}" for k in wrong)}. Set {need} in '
                             f'model.backbone (configs/vminet_<arch>_release-{revision}_in1k.py does)')

    def _check_block_keys(self, state_dict: Mapping, prefix: str) -> None:
        """The block layout visible in the keys: release names (``conv``) and ``g.bn`` against ``proj_norm``."""
        found = {m.group(1) + ('.bn' if m.group(2) else '') for k in state_dict if k.startswith(prefix)
                 for m in [_BLOCK_KEY.match(k[len(prefix):])] if m}
        if 'conv' in found or 'conv.bn' in found:
            raise ValueError(f'{prefix}stages.*.conv.* keys: an unconverted VMINet release state dict (revision '
                             f'7c2632c names the blocks\' 7x7 ConvBN conv); convert it with '
                             f'tools/model_converters/release_to_mmppma.py --family VMINet')
        if 'g' not in found:
            return
        if self.proj_norm and 'g.bn' not in found:
            raise ValueError(f'the checkpoint has no {prefix}stages.*.g.bn.* keys (no BatchNorm after g, as the '
                             f'release revision 7c2632c); this backbone has proj_norm=True. Set proj_norm=False '
                             f'in model.backbone')
        if not self.proj_norm and 'g.bn' in found:
            raise ValueError(f'the checkpoint has {prefix}stages.*.g.bn.* keys (BatchNorm after g); this backbone '
                             f'has proj_norm=False. Set proj_norm=True in model.backbone')

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """Before loading: the release record in ``local_metadata`` (kept by mmengine's ``load_checkpoint``
        and torch's ``load_state_dict``) and the block keys must fit this backbone's options."""
        record = local_metadata.get(RELEASE_RECORD)
        if record:
            self.check_release_record(record)
        self._check_block_keys(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def init_weights(self) -> None:
        """Apply ``init_cfg``. A Pretrained checkpoint with a ``prefix`` loses torch's load metadata on mmengine's
        prefix path, so its release record is read from the file here and checked first."""
        for cfg in self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]:
            if isinstance(cfg, Mapping) and cfg.get('type') == 'Pretrained' and cfg.get('prefix'):
                record = read_release_record(cfg['checkpoint'], RELEASE_RECORD, cfg['prefix'])
                if record:
                    self.check_release_record(record)
        super().init_weights()

    def _stage_block_name(self, parts: List[str]) -> Optional[Tuple[int, int]]:
        """Block b of stage s (``stages.s.{b+1}``): 1 + sum(depths[:s]) + b; a stage's downsample
        (``stages.s.0``) goes with its first block."""
        if parts[0] != self.stages_name or len(parts) <= 2:
            return None
        stage, index = int(parts[1]), int(parts[2])
        return stage, 1 + sum(self.depths[:stage]) + max(index - 1, 0)

