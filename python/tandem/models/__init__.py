"""Ready-made models written with tandem.layer (train them with tandem.opt), and Hugging Face models read and
written (Llama, GPT-2)."""
from .gpt import GPT
from .llama import Llama, from_pretrained

__all__ = ["GPT", "Llama", "from_pretrained"]
