"""bftrainer: training on the idle, unbackfillable nodes of a supercomputer."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bftrainer")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
