"""llmpar-dpo: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) as
an llmpar workload, `[workload.dpo]`: the trained policy beside a frozen reference model
whose forward pass scores every chosen and rejected response.

llmpar finds it through the `llmpar` entry-point group once the distribution is
installed; nothing registers it otherwise.
"""

from llmpar_dpo.config import DpoConfig
from llmpar_dpo.workload import DpoWorkload

__version__ = "0.1.0"

__all__ = ["DpoConfig", "DpoWorkload", "__version__"]
