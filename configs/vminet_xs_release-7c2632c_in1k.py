# VMINet-XS as release revision 7c2632c of yws-wxs/VMINet ('tril' context mask, no BatchNorm after g), for
# its converted checkpoints (tools/model_converters/release_to_mmppma.py --family VMINet prints this path).
_base_ = ['./vminet_xs_8xb128_in1k.py']

model = dict(backbone=dict(context_mask='tril', proj_norm=False))
