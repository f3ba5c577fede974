"""Optional dependencies: one place that imports them and says how to install them (the
evaluation measures and the data loaders both use it).

The extrinsic measures of the speech and vision tasks (WER/PER, PSNR/SSIM, METEOR) come
from maintained libraries that are not core dependencies of attnlab; they are in the
``eval`` extra (``pip install 'attnlab[eval]'``). WordNet, METEOR's synonym stage, is the
Debian package ``wordnet-base`` (read from ``/usr/share/wordnet``); espeak-ng, the speech
task's synthesiser, is the Debian package ``espeak-ng``. A missing one raises
:class:`MissingDependencyError` naming the command that installs it, and the tests skip
with that command as the reason.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["INSTALL", "MissingDependencyError", "install_command", "require"]

#: module -> the command that installs it
INSTALL: dict[str, str] = {
    "jiwer": "pip install jiwer (or pip install 'attnlab[eval]')",
    "torchmetrics": "pip install torchmetrics (or pip install 'attnlab[eval]')",
    "nltk": "pip install nltk (or pip install 'attnlab[eval]')",
    "skimage": "pip install scikit-image",
    "wordnet": "apt-get install wordnet-base (Debian; or make system)",
    "espeak-ng": "apt-get install espeak-ng (Debian; or make system)",
}


class MissingDependencyError(ModuleNotFoundError):
    """An optional library or data package that a measure needs is not installed; the
    message says how to install it."""


def install_command(name: str) -> str:
    """The command that installs the optional dependency ``name`` (a module name or one of
    ``"wordnet"``, ``"espeak-ng"``)."""
    return INSTALL.get(name, f"pip install {name}")


def require(module: str) -> ModuleType:
    """``import module``, or :class:`MissingDependencyError` naming the install command
    when it (or its top-level package) is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = module.split(".")[0]
        if err.name is not None and err.name.split(".")[0] != top:
            raise  # the library is there but one of its own dependencies is not
        raise MissingDependencyError(
            f"{top} is not installed: {install_command(top)}", name=top
        ) from None
