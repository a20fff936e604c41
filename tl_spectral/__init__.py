"""tl_spectral: spectral and geometric analyses of attention as TransformerLens probes."""
__version__ = "0.1.0"
