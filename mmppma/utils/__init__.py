"""Utilities: the weights_only checkpoint allowlist and the launcher helpers of tools/train.py and test.py
(plus :mod:`.checks`, imported by its users)."""
from .checkpoint import allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals
from .launch import (
                     apply_test_amp,
    build_runner,
    check_data,
    launcher_parser,
    load_launch_config,
    missing_data,
    parse_launcher_args,
    register_scope_modules,
    set_local_rank,
    setup_cpu_distributed,
    setup_work_dir,
)

__all__ = [
    'allow_mmengine_checkpoint_globals', 'mmengine_checkpoint_globals', 'build_runner', 'register_scope_modules',
    'set_local_rank', 'setup_cpu_distributed', 'setup_work_dir', 'launcher_parser', 'load_launch_config',
    'parse_launcher_args', 'check_data', 'missing_data', 'apply_test_amp'
]
