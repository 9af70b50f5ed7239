"""The README's "Fine-tune from release weights" walk-through, run as written on a synthetic checkpoint in the
release's layout (random tensors with the keys and shapes of tests/fixtures/official_ppma_T_keys.txt): the
converter command, then the config's init_cfg in an mmdet detector, and the same file in the repository's
mmseg UPerNet config. The backbone must end up holding the release tensors."""
import re
import shlex
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from .conftest import REPO_ROOT
from .test_converter import fake_release_state

HEAD_KEYS = ('proj.', 'norm.', 'head.')


def walkthrough() -> tuple:
    """(converter argv, config text) from the README section."""
    text = (REPO_ROOT / 'README.md').read_text()
    section = text[text.index('### Fine-tune from release weights'):]
    bash = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    python = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    return shlex.split(bash.replace('\\\n', ' ')), python


@pytest.fixture(scope='module')
def converted(tmp_path_factory) -> tuple:
    """Run the README's converter command on a release-format file; (backbone checkpoint, release state)."""
    tmp = tmp_path_factory.mktemp('finetune')
    argv, _ = walkthrough()
    assert argv[:2] == ['.venv/bin/python', 'tools/model_converters/ppma_official_to_mmppma.py'], argv
    release, backbone = tmp / 'release.pth', tmp / 'backbone.pth'
    state = fake_release_state('T')
    torch.save({'model': state}, release)
    args = [str(release) if a == 'ppma_t_release.pth' else str(backbone) if a.endswith('backbone.pth') else a
            for a in argv[2:]]
    proc = subprocess.run([sys.executable, str(REPO_ROOT / argv[1]), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = torch.load(backbone, map_location='cpu')
    written = written.get('state_dict', written)
    assert written and all(k.startswith('backbone.') for k in written)  # --backbone-only
    return backbone, state


def assert_release_weights(backbone: torch.nn.Module, state: dict) -> None:
    got = backbone.state_dict()
    keys = [k for k in state if not k.startswith(HEAD_KEYS)]
    assert set(keys) <= set(got)
    for key in keys:
        torch.testing.assert_close(got[key], state[key], rtol=0, atol=0, msg=key)


def build_and_init(cfg: Config, scope: str, state: dict):
    registry = {'mmdet': 'mmdet.registry', 'mmseg': 'mmseg.registry'}[scope]
    pytest.importorskip(f'{scope}.models')
    models = __import__(registry, fromlist=['MODELS']).MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = models.build(cfg.model)
    key = 'layers.2.blocks.7.retention.path_embed.A_log'
    assert not torch.equal(model.backbone.state_dict()[key], state[key])  # built with its own init
    model.init_weights()
    return model


@pytest.mark.slow
def test_readme_config_loads_release_weights_into_mask_rcnn(converted):
    path, state = converted
    _, text = walkthrough()
    assert "checkpoint='checkpoints/ppma_t_backbone.pth'" in text
    cfg = Config.fromstring(text.replace('checkpoints/ppma_t_backbone.pth', str(path)), file_format='.py')
    model = build_and_init(cfg, 'mmdet', state)
    assert_release_weights(model.backbone, state)


@pytest.mark.slow
def test_repository_upernet_config_loads_release_weights(converted):
    path, state = converted
    cfg = Config.fromfile(str(REPO_ROOT / 'configs' / 'upernet_ppma_t_512x512_160k_ade20k.py'))
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    cfg.merge_from_dict({'model.backbone.init_cfg.checkpoint': str(path)})  # the README's --cfg-options
    model = build_and_init(cfg, 'mmseg', state)
    assert_release_weights(model.backbone, state)
