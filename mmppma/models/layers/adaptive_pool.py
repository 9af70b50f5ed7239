"""Kept so that the old import path names the new one."""
raise ImportError('mmppma.models.layers.adaptive_pool is now mmppma.deploy.pools (the pools serve the ONNX export '
                  'only)')
