#!/usr/bin/env python
"""Folded into tools/benchmark_model.py: this command only says so (exit status 2).

    python tools/benchmark_model.py --compile none default [reduce-overhead] [--mode infer|train] ...
"""
import sys

MESSAGE = ('tools/benchmark_compile.py is folded into tools/benchmark_model.py: run python tools/benchmark_model.py '
           '--compile none default [reduce-overhead] (--mode infer or train, --batch, --shape; every model, impl and '
           'compile mode in one run)')


def main(argv=None) -> int:
    print(MESSAGE, file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main())
