"""mmppma: Polyline Path Masked Attention for OpenMMLab 2.0."""
from .version import __version__

__all__ = ['__version__']
