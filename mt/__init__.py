"""mt: train and use Transformer machine-translation models from one command line."""

__version__ = "0.1.0"
