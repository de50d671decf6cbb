"""Ready-made models written with tandem.layer (train them with tandem.opt)."""
from .gpt import GPT

__all__ = ["GPT"]
