"""Kept so that the old import path names the new one."""
raise ImportError('mmppma.utils.launch is now mmppma.utils.runner_setup (the runner set-up of tools/train.py and '
                  'tools/test.py); register_scope_modules is in mmppma.utils.configs, and `from mmppma.utils import '
                  'NAME` finds either')
