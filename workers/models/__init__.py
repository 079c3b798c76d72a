"""Models: one GRU backbone, two latent families, and the z-free base decoder."""

from workers.models.backbone import ConditionalDecoder, SequenceEncoder
from workers.models.config import ModelConfig
from workers.models.cvae import CVAE, BaseDecoder, CVAEOutput

__all__ = ["CVAE", "BaseDecoder", "CVAEOutput", "ConditionalDecoder", "ModelConfig", "SequenceEncoder"]
