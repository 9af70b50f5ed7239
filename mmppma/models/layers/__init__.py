"""nn.Modules of the backbone families (PPMA/RMT, MLLA, VMINet), built on :mod:`mmppma.ops`. No registry code here."""
from .attention import PPMA_ATTN_TYPES, PPMA_FORMS, PPMA_MASKS, PolylinePathAttention, check_variant
from .block import BlockStage, DropPath, PPMABlock, PPMAStage
from .conv import ConvDownsample, ConvStem, DWConv2d
from .ffn import ConvFFN
from .path_embed import PathEmbed
from .rope import PositionTables, RasterRoPE2D, apply_rope, rmt_log_decay, rope_angles, rotate_every_two

__all__ = [
    'PPMA_ATTN_TYPES', 'PPMA_FORMS', 'PPMA_MASKS', 'PolylinePathAttention', 'check_variant', 'BlockStage', 'DropPath',
    'PPMABlock', 'PPMAStage', 'ConvDownsample', 'ConvStem', 'DWConv2d', 'ConvFFN', 'PathEmbed', 'PositionTables',
    'RasterRoPE2D', 'apply_rope', 'rmt_log_decay', 'rope_angles', 'rotate_every_two'
]
