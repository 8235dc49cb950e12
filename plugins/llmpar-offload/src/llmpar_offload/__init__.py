"""llmpar-offload: optimizer states, gradients and weights kept in host memory
(ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840; ZeRO-Infinity, Rajbhandari et al.
2021, arXiv:2104.07857) as an llmpar strategy, `[parallel.offload]`.

llmpar finds it through the `llmpar` entry-point group once the distribution is
installed; nothing registers it otherwise.
"""

from llmpar_offload.config import OffloadConfig
from llmpar_offload.strategy import OffloadStrategy

__version__ = "0.1.0"

__all__ = ["OffloadConfig", "OffloadStrategy", "__version__"]
