"""Release checkpoints (random tensors, the releases' keys and shapes) loaded where a user points at them, and
mmppma's model index in mmpretrain (weights served locally), against the explicit route: release_to_mmppma."""
import functools
import http.server
import math
import threading
from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.nn as nn
import yaml

from mmppma.models import MLLA, PPMA, PPMAClsHead, VMINet
from mmppma.models.backbones import release
from mmppma.models.backbones.vminet_spec import RELEASE_REVISIONS
from mmppma.models.conversion import CheckpointMismatchError, release_to_mmppma
from mmppma.utils import model_zoo

from .conftest import fixture_shapes, random_tensors
from .models.conftest import SMALL_ARCH

REPO = Path(__file__).resolve().parents[1]
KEY_LISTS = {'PPMA': 'ppma_T', 'MLLA': 'mlla_T', 'VMINet': 'vminet_Ti'}
BACKBONES = {
    'PPMA': lambda **kw: PPMA('tiny', **kw),
    'MLLA': lambda **kw: MLLA('tiny', **kw),
    'VMINet': lambda **kw: VMINet('ti', **{k: v for k, v in RELEASE_REVISIONS['6b11d4a'].items()}, **kw),
}
PPMA_T = 'mmppma_ppma-t_3rdparty_in1k'
CONFIGS = {'PPMA': 'ppma_t_8xb128_in1k.py', 'VMINet': 'vminet_ti_release-6b11d4a_in1k.py',
           'MLLA': 'mlla_t_8xb128_in1k.py'}


@functools.lru_cache(maxsize=None)
def _release_state(name: str) -> Dict[str, torch.Tensor]:
    return random_tensors(fixture_shapes(name), scale=0.05)


def release_state(family: str) -> dict:
    """A classification release state dict of the family's smallest arch (a copy)."""
    return dict(_release_state(KEY_LISTS[family]))


def save_release(path: Path, state: dict) -> str:
    """A release file: the state under ``model`` beside training state, as the releases save it."""
    torch.save({'model': state, 'epoch': 299, 'max_accuracy': 0.0}, path)
    return str(path)


# ---------------------------------------------------------------- a backbone's init_cfg
@pytest.mark.parametrize('family', ['PPMA', pytest.param('MLLA', marks=pytest.mark.heavy), 'VMINet'])
def test_init_cfg_converts_a_release_checkpoint(family, tmp_path, monkeypatch):
    """A dense backbone with the det/seg configs' ``init_cfg`` (prefix 'backbone.') given a release classification
    checkpoint: every backbone tensor is the converter's, only the output norms the release lacks are left."""
    reports = []
    monkeypatch.setattr(release, '_log', reports.append)  # the report mmengine's logger receives
    state = release_state(family)
    path = save_release(tmp_path / 'best.pth', state)
    backbone = BACKBONES[family](out_indices=(0, 1, 2, 3),
                                 init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    backbone.init_weights()
    reports = list(reports)  # init_weights' own; the reference conversion below logs its line too
    want, _ = release_to_mmppma(state, family, backbone_only=True)
    want = {k[len('backbone.'):]: v for k, v in want.items()}
    got = backbone.state_dict()
    unused = sorted(set(want) - set(got))  # VMINet: the classifier's BatchNorm norm3 beside LayerNorm outputs
    assert unused == ([f'norm3.{k}' for k in ('bias', 'num_batches_tracked', 'running_mean', 'running_var',
                                               'weight')] if family == 'VMINet' else [])
    for key in set(want) - set(unused):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    fresh = sorted(set(got) - set(want))
    norms = tuple(f'{backbone.out_norm_name(i)}.' for i in range(4))
    assert fresh and all(k.startswith(norms) for k in fresh), fresh
    arch = {'PPMA': 'tiny', 'MLLA': 't', 'VMINet': 'ti'}[family]  # the arch each was built with, as its table names it
    assert len(reports) == 1 and f'converted from the {family}-{arch} release' in reports[0]
    assert all(repr(k) in reports[0] for k in fresh)  # what was left at its initialization is named
    if family == 'PPMA':  # the release's own backbone names, unchanged (docs/checkpoints.md)
        for key in want:
            assert torch.equal(got[key], state[key]), key


def test_init_cfg_names_missing_and_unexpected_keys(tmp_path):
    backbone = PPMA('tiny', out_indices=(3, ), out_norm=False)
    extra, missing = 'layers.0.blocks.0.extra.weight', 'layers.0.blocks.0.ffn.fc1.bias'
    for name, edit in ((extra, lambda s: s.update({extra: torch.zeros(3)})), (missing, lambda s: s.pop(missing))):
        state = release_state('PPMA')
        edit(state)
        backbone.init_cfg = dict(type='Pretrained', checkpoint=save_release(tmp_path / 'best.pth', state))
        with pytest.raises(CheckpointMismatchError, match=name.replace('.', r'\.')):
            backbone.init_weights()


# ---------------------------------------------------------------- a whole model's load_state_dict
def test_whole_model_load_converts_and_checks():
    """The release classifier's module tree as mmpretrain's ImageClassifier holds it (backbone, head); a release
    into a model with more modules names them and init_cfg."""
    state, model = release_state('PPMA'), nn.ModuleDict(dict(backbone=PPMA('tiny', out_indices=(3, ), out_norm=False),
                                                              head=PPMAClsHead(1000, 512, 1024, loss=nn.Identity())))
    model.load_state_dict(state)  # strict: every key consumed, none missing
    converted, _ = release_to_mmppma(state, 'PPMA')
    for key, value in model.state_dict().items():
        assert torch.equal(value, converted[key]), key
    state['head.extra'] = torch.zeros(1)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \['head\.fc\.extra'\]"):
        model.load_state_dict(state)
    larger = nn.ModuleDict(dict(backbone=PPMA(SMALL_ARCH, out_indices=(3, ), out_norm=False), neck=nn.Linear(2, 2)))
    with pytest.raises(CheckpointMismatchError, match=r"\['neck'\].*init_cfg"):
        larger.load_state_dict(release_state('PPMA'))


# ---------------------------------------------------------------- mmpretrain: init_model, get_model, Inferencer
class _Quiet(http.server.SimpleHTTPRequestHandler):

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    """A release-layout PPMA-T checkpoint served at http://127.0.0.1:PORT/.../best.pth (the release's path)."""
    root = tmp_path_factory.mktemp('served')
    relative = 'checkpoints/classification/PPMA_T_202502251000/best.pth'
    (root / relative).parent.mkdir(parents=True)
    save_release(root / relative, release_state('PPMA'))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield dict(url=f'http://127.0.0.1:{server.server_address[1]}/{relative}', file=root / relative)
    server.shutdown()
    thread.join()


@torch.no_grad()
def logits(model, images: torch.Tensor) -> torch.Tensor:
    return model(images, mode='tensor')


@pytest.mark.parametrize('family', ['PPMA', 'VMINet', pytest.param('MLLA', marks=pytest.mark.heavy)])
def test_init_model_and_get_model_convert_release_checkpoints(family, served, tmp_path, monkeypatch):
    """init_model on a release file and, for PPMA, get_model(name, pretrained=URL) (into torch hub's cache; its
    Inferencer names ImageNet classes): the explicit route's logits; VMINet into the other revision's config: an
    error naming the options."""
    from mmpretrain import ImageClassificationInferencer, get_model
    from mmpretrain.apis import init_model
    config, state = str(REPO / 'configs' / CONFIGS[family]), release_state(family)
    converted, _ = release_to_mmppma(state, family)
    torch.save({'state_dict': converted}, tmp_path / 'converted.pth')
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = logits(init_model(config, str(tmp_path / 'converted.pth')), images)
    release = save_release(tmp_path / 'release.pth', state)
    torch.testing.assert_close(logits(init_model(config, release), images), want, rtol=0, atol=0)
    if family == 'VMINet':
        with pytest.raises(ValueError, match="context_mask='none'.*proj_norm=True|proj_norm=True.*context_mask"):
            init_model(str(REPO / 'configs/vminet_ti_release-7c2632c_in1k.py'), release)
    if family == 'PPMA':
        monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
        model = get_model(PPMA_T, pretrained=served['url'])
        torch.testing.assert_close(logits(model, images), want, rtol=0, atol=0)
        cached = tmp_path / 'torch_home' / 'hub' / 'checkpoints' / 'best.pth'
        assert cached.read_bytes() == served['file'].read_bytes()
        check_top5(lambda: ImageClassificationInferencer(model))


def check_top5(make_inferencer) -> None:
    """The inferencer ``make_inferencer()`` builds gives top-5 ImageNet class names; built and run in mmpretrain's
    scope (another test's Runner may have left its own as the process's current default scope)."""
    from mmengine.registry import DefaultScope
    from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
    image = torch.randint(0, 256, (96, 120, 3), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        result = make_inferencer()(image.numpy())[0]
    scores = torch.as_tensor(result['pred_scores'])
    assert scores.shape == (1000, )
    top5 = [IMAGENET_CATEGORIES[i] for i in scores.topk(5).indices.tolist()]
    assert result['pred_class'] == top5[0] and len(set(top5)) == 5


@pytest.mark.heavy
def test_inferencer_by_name_gives_top5_class_names(served, tmp_path, monkeypatch):
    from mmpretrain import ImageClassificationInferencer
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    check_top5(lambda: ImageClassificationInferencer(PPMA_T, pretrained=served['url']))


def test_release_url_loader_caches_under_a_name_unique_to_the_url(served, tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    checkpoint = model_zoo.load_release_url(served['url'], map_location='cpu')
    assert torch.equal(checkpoint['model']['head.weight'], release_state('PPMA')['head.weight'])
    cached = tmp_path / 'torch_home' / 'hub' / 'checkpoints' / model_zoo.cache_name(served['url'])
    assert cached.read_bytes() == served['file'].read_bytes()
    urls = [m['Weights'] for m in metafile('ppma')['Models'] if m['Name'].endswith('_in1k')]
    assert {Path(u).name for u in urls} == {'best.pth'}
    assert len({model_zoo.cache_name(u) for u in urls}) == 3
    mlla = metafile('mlla')['Models'][0]['Weights']  # TsinghuaCloud: /f/<id>/?dl=1, no file name in the URL
    assert model_zoo.cache_name(mlla) == f'cloud.tsinghua.edu.cn_f_{mlla.split("/")[-2]}.pth'


def test_mmengine_reads_the_release_hosts_through_the_release_loader(monkeypatch):
    """mmengine's CheckpointLoader sends the release hosts' URLs to load_release_url (a cache name per URL) and
    every other URL to its own loader (torch hub's default name)."""
    from mmengine.runner import checkpoint
    calls = []
    monkeypatch.setattr(torch.hub, 'load_state_dict_from_url',
                        lambda url, **kw: calls.append(('release', url, kw['file_name'])) or {})
    monkeypatch.setattr(checkpoint, 'load_url', lambda url, **kw: calls.append(('mmengine', url)) or {})
    release, other = metafile('ppma')['Models'][0]['Weights'], 'https://example.org/checkpoints/best.pth'
    for url in (release, other):
        checkpoint.CheckpointLoader.load_checkpoint(url, map_location='cpu')
    assert calls == [('release', release, model_zoo.cache_name(release)), ('mmengine', other)]


# ---------------------------------------------------------------- the index
def metafile(family: str) -> dict:
    return yaml.safe_load((REPO / 'mmppma' / '.mim' / 'metafiles' / family / 'metafile.yml').read_text())


INDEX_NAMES = [m['Name'] for family in ('ppma', 'rmt', 'mlla', 'vminet') for m in metafile(family)['Models']]


def test_index_lists_every_family_with_existing_configs():
    pytest.importorskip('mmpretrain.apis')
    from mmpretrain import list_models
    from mmpretrain.apis import ModelHub
    names = list_models('*ppma*')
    assert {f'mmppma_{f}' for f in ('ppma', 'rmt', 'mlla', 'vminet')} <= {n.split('-')[0] for n in names}
    assert [n for n in names if not Path(ModelHub._models_dict[n].config).is_file()] == []


@pytest.mark.parametrize('first', ['mmppma', pytest.param('mmpretrain', marks=pytest.mark.heavy)])
def test_index_is_registered_whichever_is_imported_first(first, run_python):
    """mmppma registers its index with ModelHub at once when mmpretrain's apis are imported, else right after
    they are; importing mmppma alone imports no mmpretrain."""
    pytest.importorskip('mmpretrain.apis')
    second = 'mmpretrain.apis' if first == 'mmppma' else 'mmppma'
    code = (f'import sys, {first}; before = "mmpretrain" in sys.modules; import {second}; '
            'from mmpretrain import list_models; print(before, len(list_models("mmppma_*")))')
    out = run_python(['-c', code]).stdout.split()
    assert out == [str(first == 'mmpretrain'), str(len(INDEX_NAMES))]


def test_ppma_index_weights_and_parameter_counts():
    """The weights are the release files in direct-download form; the parameter counts (tools/get_flops.py) are the
    release state dicts' non-buffer totals."""
    models = {m['Name']: m for m in metafile('ppma')['Models']}
    assert len(models) == 9
    for model in models.values():
        page = model['Converted From']['Weights']
        assert page.startswith('https://huggingface.co/ZhongchenZhao/PPMA/blob/main/checkpoints/')
        assert model['Weights'] == page.replace('/blob/main/', '/resolve/main/', 1)
    buffers = ('running_mean', 'running_var', 'num_batches_tracked', 'Relpos.angle')
    for size in 'TSB':
        total = sum(math.prod(shape) for key, shape in fixture_shapes(f'ppma_{size}').items()
                    if not key.endswith(buffers))
        assert models[f'mmppma_ppma-{size.lower()}_3rdparty_in1k']['Metadata']['Parameters'] == total, size
