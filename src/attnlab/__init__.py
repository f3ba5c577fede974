"""attnlab: the attention mechanisms of the survey literature as composable PyTorch modules.

Start with :class:`attnlab.Attention` (the general attention model: any score x any
alignment x any dimensionality), :mod:`attnlab.functional` (the same as pure functions),
:mod:`attnlab.masks` (the one mask convention), :func:`attnlab.build` (build by name
from a config dict) and :func:`attnlab.capture_weights` (the weights of every attention
module inside a model).

Every mechanism of the library core is importable from here as ``attnlab.<Name>`` and from
its section package: :mod:`attnlab.general` (scores, alignments, dimensionality),
:mod:`attnlab.feature` (survey section 3.1) and :mod:`attnlab.query` (section 3.3). The
core imports nothing of the lab (``attnlab.models``, ``attnlab.lab``, ``attnlab.evaluation``,
``attnlab.data``, ``attnlab.viz``).
"""

from attnlab import feature, functional, general, masks, query, registry
from attnlab._checks import ConfigError
from attnlab._deprecation import deprecated_aliases
from attnlab.capture import capture_weights
from attnlab.feature import *  # noqa: F403
from attnlab.general import *  # noqa: F403
from attnlab.output import AttentionOutput
from attnlab.query import *  # noqa: F403
from attnlab.registry import build

__version__ = "0.1.0"

__all__ = [
    "AttentionOutput",
    "ConfigError",
    "__version__",
    "build",
    "capture_weights",
    "feature",
    "functional",
    "general",
    "masks",
    "query",
    "registry",
]
__all__ += general.__all__
__all__ += feature.__all__
__all__ += query.__all__


#: the deprecated names of the section packages (``attnlab.MultiQueryAttention``)
__getattr__ = deprecated_aliases(__name__, query.DEPRECATED_ALIASES)
