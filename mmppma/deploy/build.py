"""The model of a config as it is exported: :func:`build_model`."""
import torch

from mmppma.utils.configs import build_config_model

__all__ = ['build_model']


def build_model(config: str, checkpoint=None, backbone_only: bool = False, cfg_options=None) -> torch.nn.Module:
    """The config's model (or its backbone) on CPU in eval mode, SyncBN reverted to BatchNorm, with the
    checkpoint's weights if given."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.runner import load_checkpoint

    model = build_config_model(config, backbone_only=backbone_only, cfg_options=cfg_options)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu', revise_keys=[(r'^backbone\.', '')] if backbone_only
                        else [(r'^module\.', '')])
    return revert_sync_batchnorm(model).eval()
