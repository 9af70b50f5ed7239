# VMINet-B as release revision 6b11d4a of yws-wxs/VMINet (no context mask, BatchNorm after g), for its
# converted checkpoints (tools/model_converters/release_to_mmppma.py --family VMINet prints this path).
_base_ = ['./vminet_b_8xb128_in1k.py']

model = dict(backbone=dict(context_mask='none', proj_norm=True))
