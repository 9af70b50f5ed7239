#!/usr/bin/env python
"""Convert a PPMA release checkpoint to mmppma's layout: ``release_to_mmppma.py --family PPMA`` (see its help)."""
import sys

from release_to_mmppma import main

if __name__ == '__main__':
    sys.exit(main(family='PPMA'))
