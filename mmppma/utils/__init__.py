"""What mmppma's layers share outside the models: the argument checks (:mod:`.checks`), the weights_only
allowlist of mmengine checkpoints (:mod:`.checkpoint`), the release models' index (:mod:`.model_zoo`), building the
model of a config (:mod:`.configs`) and the runner set-up of tools/train.py and tools/test.py
(:mod:`.runner_setup`).

Importing this package imports none of them; ``from mmppma.utils import NAME`` imports the module that holds NAME.
"""
import importlib

#: name -> the module of this package that holds it
_HOMES = {
    'allow_mmengine_checkpoint_globals': 'checkpoint',
    'mmengine_checkpoint_globals': 'checkpoint',
    'register_scope_modules': 'configs',
    'build_config_model': 'configs',
    'load_config': 'configs',
    **{name: 'runner_setup' for name in ('build_runner', 'set_local_rank', 'setup_cpu_distributed', 'setup_work_dir',
                                         'finish_distributed', 'launcher_parser', 'load_launch_config',
                                         'parse_launcher_args', 'check_data', 'missing_data', 'apply_test_amp')},
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f'{__name__}.{_HOMES[name]}'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
