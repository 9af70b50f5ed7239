# PPMLA-T on ImageNet-1K: MLLA-T (./mlla_t_8xb128_in1k.py, the release's recipe) whose linear attention is
# multiplied by the polyline path mask (mask='polyline', O(N); paper Appendix A.7). The learned decays' A_log /
# dt_bias get no weight decay (the recipe's no_decay_names).
_base_ = './mlla_t_8xb128_in1k.py'

model = dict(backbone=dict(mask='polyline'))
