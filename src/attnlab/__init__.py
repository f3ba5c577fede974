"""attnlab: the attention mechanisms of the survey literature as composable PyTorch modules.

Start with :class:`attnlab.Attention` (the general attention model: any score x any
alignment x any dimensionality), :mod:`attnlab.functional` (the same as pure functions),
:mod:`attnlab.masks` (the one mask convention) and :func:`attnlab.build` (build by name
from a config dict).
"""

from attnlab import functional, masks, registry
from attnlab._checks import ConfigError
from attnlab.general import Attention
from attnlab.output import AttentionOutput
from attnlab.registry import build

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "AttentionOutput",
    "ConfigError",
    "__version__",
    "build",
    "functional",
    "masks",
    "registry",
]
