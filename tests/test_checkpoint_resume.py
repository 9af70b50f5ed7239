"""Saving, resuming and loading mmengine checkpoints under torch >= 2.6 (``weights_only=True``) and the launchers'
options: a toy regression model (its classes named in configs by import path) stopped after epoch 1 and resumed
ends with exactly the state of an uninterrupted 2-epoch run."""
import pickle
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.model import BaseModel
from torch import nn
from torch.utils.data import Dataset

import mmppma  # noqa: F401  (allowlists the checkpoint globals)
from mmppma.utils.checkpoint import history_buffer_getattr

from .conftest import TOOLS, load_tool

IMPORT_ROOT = Path(__file__).resolve().parents[len(__name__.split('.')) - 1]  # imports this module in a subprocess
SAMPLES, BATCH, EPOCHS = 8, 2, 2
ITERS_PER_EPOCH = SAMPLES // BATCH


class ToyRegressor(BaseModel):
    """y = w.x + b; ``mode='predict'`` returns per-sample dicts for the metric and DumpResults."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, inputs, targets, mode: str = 'tensor'):
        pred, target = self.fc(torch.stack(inputs)).squeeze(-1), torch.stack(targets)
        if mode == 'loss':
            return dict(loss=F.mse_loss(pred, target))
        return [dict(pred=p, target=t) for p, t in zip(pred.detach(), target)] if mode == 'predict' else pred


class ToyDataset(Dataset):
    """Fixed random samples of a noisy linear function."""
    metainfo = dict(name='toy')

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        gen = torch.Generator().manual_seed(index)
        x = torch.randn(4, generator=gen)
        return dict(inputs=x, targets=x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn((), generator=gen))


class ToyMSE(BaseMetric):

    def process(self, data_batch, data_samples) -> None:
        self.results.extend(float((s['pred'] - s['target'])**2) for s in data_samples)

    def compute_metrics(self, results: list) -> dict:
        return dict(mse=sum(results) / len(results))


def toy_config(work_dir: Path, name: str, epochs: int = EPOCHS) -> Config:
    here = __name__
    loader = dict(dataset=dict(type=f'{here}.ToyDataset'), batch_size=BATCH, num_workers=0)
    return Config(dict(
        default_scope='mmengine', experiment_name=name, work_dir=str(work_dir), model=dict(type=f'{here}.ToyRegressor'),
        train_dataloader=dict(loader, sampler=dict(type='DefaultSampler', shuffle=True, seed=0)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9)),
        param_scheduler=dict(type='MultiStepLR', milestones=[1], by_epoch=True, end=EPOCHS),  # whatever max_epochs
        test_dataloader=dict(loader, sampler=dict(type='DefaultSampler', shuffle=False)), test_cfg=dict(),
        test_evaluator=dict(type=f'{here}.ToyMSE'), default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=1), logger=dict(type='LoggerHook', interval=1)),
        randomness=dict(seed=0), log_level='INFO'))


def run_training(work_dir: Path, name: str, epochs: int = EPOCHS, resume_from: Optional[Path] = None):
    """The runner after training, and the (epoch, iter) it started from."""
    from mmengine.runner import Runner
    cfg = toy_config(work_dir, name, epochs)
    if resume_from is not None:
        cfg.resume, cfg.load_from = True, str(resume_from)
    runner = Runner.from_cfg(cfg)
    runner.load_or_resume()  # what train() does first
    start = runner.epoch, runner.iter
    runner.train()
    return runner, start


@pytest.fixture(scope='module')
def reference(tmp_path_factory) -> dict:
    """State dict after an uninterrupted 2-epoch run."""
    runner, _ = run_training(tmp_path_factory.mktemp('reference'), 'ckpt_reference')
    assert runner.iter == EPOCHS * ITERS_PER_EPOCH
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


@pytest.fixture(scope='module')
def interrupted_work_dir(tmp_path_factory) -> Path:
    """A work dir holding ``epoch_1.pth`` of a run stopped right after saving it (as a crash would)."""
    work_dir = tmp_path_factory.mktemp('interrupted')
    run_training(work_dir, 'ckpt_interrupted', epochs=1)
    assert (work_dir / 'epoch_1.pth').is_file()
    return work_dir


def assert_state_is(state: dict, reference: dict) -> None:
    for key, value in state.items():
        torch.testing.assert_close(value, reference[key], msg=f'{key} differs from the uninterrupted run')


def test_runner_resume_continues_exactly(interrupted_work_dir, reference, tmp_path):
    runner, start = run_training(tmp_path, 'ckpt_resumed', resume_from=interrupted_work_dir / 'epoch_1.pth')
    assert start == (1, ITERS_PER_EPOCH), 'did not resume'
    assert (runner.epoch, runner.iter) == (EPOCHS, EPOCHS * ITERS_PER_EPOCH)
    assert runner.optim_wrapper.get_lr()['lr'] == [pytest.approx(0.005)]  # the scheduler's milestone 1 came back
    assert_state_is(runner.model.state_dict(), reference)


def test_torch_load_reads_mmengine_checkpoint_only_with_mmppma(interrupted_work_dir, run_python):
    """torch's default (weights_only) load reads the file once mmppma is imported; a process without mmppma is
    refused (torch >= 2.6), which shows the allowlist is what makes the load work."""
    checkpoint = torch.load(interrupted_work_dir / 'epoch_1.pth')
    assert checkpoint['meta']['epoch'] == 1 and checkpoint['meta']['iter'] == ITERS_PER_EPOCH
    loss = checkpoint['message_hub']['log_scalars']['train/loss']
    assert isinstance(loss, HistoryBuffer) and len(loss.data[0]) == ITERS_PER_EPOCH
    assert np.isfinite(loss.mean()) and loss.current() == pytest.approx(float(loss.data[0][-1]))
    assert torch.is_tensor(checkpoint['state_dict']['fc.weight'])
    if tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 6):
        return  # torch < 2.6 loads with weights_only=False
    code = (f'import pickle, sys, torch\ntry:\n    torch.load({str(interrupted_work_dir / "epoch_1.pth")!r})\n'
            'except pickle.UnpicklingError as err:\n    print("REFUSED", err)\nassert "mmppma" not in sys.modules\n')
    out = run_python(['-c', code]).stdout
    assert 'REFUSED' in out and 'HistoryBuffer' in out


class _GetattrPayload:
    """Pickles as ``getattr(numpy.ndarray, 'tofile')``, which the allowlist must refuse."""

    def __reduce__(self):
        return getattr, (np.ndarray, 'tofile')


def test_weights_only_stays_restrictive(tmp_path):
    assert history_buffer_getattr(HistoryBuffer, 'mean') is HistoryBuffer.mean
    for target, name in [(HistoryBuffer, '__init__'), (HistoryBuffer, '_statistics_methods'), (np, 'save')]:
        with pytest.raises(pickle.UnpicklingError):
            history_buffer_getattr(target, name)
    path = tmp_path / 'payload.pth'
    for payload, message in ((_GetattrPayload(), 'HistoryBuffer'), (np.array([object()], dtype=object), 'ObjectDType')):
        torch.save({'x': payload}, path)
        with pytest.raises(pickle.UnpicklingError, match=message):
            torch.load(path, weights_only=True)


@pytest.mark.slow
def test_test_py_predicts_with_the_checkpoint(tmp_path, interrupted_work_dir, run_python):
    """tools/test.py --out on the interrupted run's epoch_1.pth: the predictions of the model with its weights."""
    config, out, checkpoint = tmp_path / 'toy.py', tmp_path / 'predictions.pkl', interrupted_work_dir / 'epoch_1.pth'
    toy_config(tmp_path / 'work', 'ckpt_cli').dump(str(config))
    run_python([TOOLS / 'test.py', config, checkpoint, '--work-dir', tmp_path / 'test', '--out', out],
               extra_pythonpath=[IMPORT_ROOT])
    model = ToyRegressor()
    model.load_state_dict(torch.load(checkpoint)['state_dict'])
    samples = [ToyDataset()[i] for i in range(SAMPLES)]
    expected = model([s['inputs'] for s in samples], [s['targets'] for s in samples], mode='tensor')
    torch.testing.assert_close(torch.stack([p['pred'] for p in pickle.loads(out.read_bytes())]), expected.detach())


def test_train_py_options(tmp_path):
    train = load_tool('train.py')
    assert train.parse_args(['c.py', '--resume']).resume == 'auto'
    assert train.parse_args(['c.py', '--resume', 'x.pth', '--local-rank', '1']).resume == 'x.pth'
    assert train.parse_args(['c.py']).resume is None
    cfg = Config(dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1))))
    train.apply_resume(cfg, 'auto')
    assert cfg.resume is True and cfg.load_from is None
    with pytest.raises(SystemExit, match='no such checkpoint'):
        train.apply_resume(cfg, str(tmp_path / 'missing.pth'))
    if torch.cuda.is_available():
        train.apply_amp(cfg, True)
        assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and cfg.optim_wrapper.loss_scale == 'dynamic'
    else:
        shipped = dict(type='AmpOptimWrapper', loss_scale='dynamic', optimizer=dict(type='SGD', lr=0.1))
        with pytest.raises(SystemExit, match='needs CUDA: on CPU add --amp .* optim_wrapper.type=OptimWrapper'):
            train.apply_amp(Config(dict(optim_wrapper=shipped)), False)
        for wrapper in (cfg.optim_wrapper, shipped):
            amp = Config(dict(optim_wrapper=wrapper))
            train.apply_amp(amp, True)
            assert amp.optim_wrapper.type == 'mmppma.CPUAmpOptimWrapper' and 'loss_scale' not in amp.optim_wrapper
        with pytest.raises(SystemExit, match="dtype='float16'.*bfloat16"):
            train.apply_amp(Config(dict(optim_wrapper=dict(shipped, dtype='float16'))), True)
    with pytest.raises(SystemExit, match="this config uses 'ApexOptimWrapper'"):
        train.apply_amp(Config(dict(optim_wrapper=dict(type='ApexOptimWrapper'))), True)


def test_test_py_options():
    """``--amp`` runs the test loop under bfloat16 autocast on CPU; ``--out`` adds DumpResults (a .pkl)."""
    from mmengine.runner.amp import autocast
    test = load_tool('test.py')
    assert test.parse_args(['c.py', 'w.pth', '--amp']).amp and not test.parse_args(['c.py', 'w.pth']).amp
    cfg = Config(dict(test_cfg=dict()))
    test.apply_test_amp(cfg)
    assert cfg.test_cfg == dict(fp16=True)
    if not torch.cuda.is_available():  # mmengine's TestLoop(fp16=True) runs each step under autocast(enabled=True)
        with autocast(enabled=cfg.test_cfg['fp16']):
            assert torch.is_autocast_enabled('cpu') and torch.get_autocast_dtype('cpu') == torch.bfloat16
    with pytest.raises(SystemExit, match='test_cfg.type'):
        test.apply_test_amp(Config(dict(test_cfg=dict(type='MyLoop'))))
    cfg = Config(dict(test_evaluator=dict(type='ToyMSE')))
    test.add_dump_results(cfg, 'preds.pkl')
    assert [m['type'] for m in cfg.test_evaluator] == ['ToyMSE', 'DumpResults']
    with pytest.raises(SystemExit, match='.pkl'):
        test.add_dump_results(cfg, 'preds.json')


def test_finish_distributed_leaves_the_process_group():
    """A run's end leaves the process group (one gloo process here); outside a distributed run it does nothing."""
    import torch.distributed as dist

    from mmppma.utils import finish_distributed
    finish_distributed()
    assert not dist.is_initialized()
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    finish_distributed()
    assert not dist.is_initialized()


def test_cpu_distributed_fallback_and_unknown_scope():
    from mmppma.utils import register_scope_modules, setup_cpu_distributed
    if not torch.cuda.is_available():  # the CPU fallback only applies without CUDA
        cfg = Config(dict(launcher='none'))
        setup_cpu_distributed(cfg)
        assert 'env_cfg' not in cfg  # single process: untouched
        cfg = Config(dict(launcher='slurm', env_cfg=dict(dist_cfg=dict(backend='nccl'))))
        with pytest.raises(RuntimeError, match='torchrun'):
            setup_cpu_distributed(cfg)
        assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    register_scope_modules('mmengine')  # nothing beyond mmppma
    with pytest.raises(ImportError, match="default_scope='no_such_library'.*pip install no_such_library"):
        register_scope_modules('no_such_library')
