"""Line attention: the softmax along every image row (or column) of a (.., H, W, .) map, biased by the 1-D
segment sums of the line's decay table; the two halves of criss-cross attention (:mod:`mmppma.ops.criss_cross`).
:mod:`.torch_impl` holds the autograd Function and in-place helpers, :mod:`.triton_impl` the line kernels. It has
no public op of its own: criss-cross attention composes it, and its dense reference is criss-cross's."""
