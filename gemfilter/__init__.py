"""GemFilter for Hugging Face transformers: filter a long prompt with early layers, then generate.

Shi et al. 2024, "Discovering the Gems in Early Layers: Accelerating Long-Context LLMs with 1000x
Input Token Reduction". Importing this package has no side effects: the attention wrapper is
registered with transformers the first time it is used.
"""

from .apply import GemFilterOutput, apply, generate
from .conversation import Conversation, Turn
from .layers import PAPER_LAYERS, default_layer
from .methods import REGISTRY, GemFilter, describe, get_method
from .models import load_model, set_attention
from .score import Scored, score
from .selection import Selection, select_tokens

__all__ = [
    "Conversation",
    "GemFilter",
    "GemFilterOutput",
    "PAPER_LAYERS",
    "REGISTRY",
    "Selection",
    "apply",
    "default_layer",
    "Scored",
    "describe",
    "generate",
    "get_method",
    "load_model",
    "score",
    "select_tokens",
    "set_attention",
    "Turn",
]
__version__ = "0.1.0"
