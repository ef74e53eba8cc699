"""fedjax_dp: differentially private federated learning in JAX, agents as an array axis."""
__version__ = "0.1.0"


def version() -> str:
    """This install's version (its metadata; :data:`__version__` in a checkout not installed)."""
    import importlib.metadata
    try:
        return importlib.metadata.version("fedjax-dp")
    except importlib.metadata.PackageNotFoundError:
        return __version__
