"""Kept so that the old import path names the new one."""
raise ImportError('mmppma.deploy_mask_rcnn is now mmppma.deploy.mask_rcnn (its errors: mmppma.deploy.runtime)')
