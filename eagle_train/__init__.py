"""eagle-train: train speculative-decoding draft models for vLLM."""

__version__ = "0.1.0"
