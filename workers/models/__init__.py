"""Models: one GRU backbone, two latent families, and the z-free base decoder.

Names load on first use (``lazy_loader``), so ``workers.models.config`` imports without torch.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "backbone": ["ConditionalDecoder", "SequenceEncoder"],
    "config": ["BaseModelConfig", "ModelConfig"],
    "cvae": ["CVAE", "BaseDecoder", "CVAEOutput"],
})
