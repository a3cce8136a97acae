"""bftrainer: training on the idle, unbackfillable nodes of a supercomputer."""


def __getattr__(name: str) -> str:
    """``bftrainer.__version__``, read from the installed metadata on first use only:
    ``importlib.metadata`` (with ``email``) costs ~40 ms of CPU at every start, a quarter
    of what ``bftrainer status`` needs, and only ``--version``, the daemon's start line
    and the report's footer use it."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bftrainer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"
