"""General attention (survey section 3.2): score functions, alignment functions,
dimensionality, and the general module that composes them."""

from attnlab.general.alignment import (
    Aligned,
    Alignment,
    Entmax15Align,
    HardAlign,
    LocalMAlign,
    LocalPAlign,
    ReinforcedAlign,
    SoftAlign,
    SparsemaxAlign,
)
from attnlab.general.attention import Attention
from attnlab.general.dimensionality import MultiDimensional, SingleDimensional
from attnlab.general.scoring import (
    ActivatedGeneralScore,
    AdditiveScore,
    BiasedGeneralScore,
    CosineScore,
    DotScore,
    GeneralScore,
    QuerylessScore,
    ScaledDotScore,
    Score,
)

__all__ = [
    "ActivatedGeneralScore",
    "AdditiveScore",
    "Aligned",
    "Alignment",
    "Attention",
    "BiasedGeneralScore",
    "CosineScore",
    "DotScore",
    "Entmax15Align",
    "GeneralScore",
    "HardAlign",
    "LocalMAlign",
    "LocalPAlign",
    "MultiDimensional",
    "QuerylessScore",
    "ReinforcedAlign",
    "ScaledDotScore",
    "Score",
    "SingleDimensional",
    "SoftAlign",
    "SparsemaxAlign",
]
