"""tl_spectral: spectral and geometric analyses of attention as TransformerLens probes."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``from tl_spectral import zoo``: the model zoo, imported on first use
    if name == "zoo":
        from tl_spectral.models import zoo

        return zoo
    raise AttributeError(f"module 'tl_spectral' has no attribute {name!r}")
