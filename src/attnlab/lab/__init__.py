"""The lab: tasks on real data, training, ablation studies, results and reports.

* :mod:`attnlab.lab.task` -- the :class:`Task` contract and :func:`spec_label`.
* :mod:`attnlab.lab.tasks` -- the registered tasks (``attnlab list --kind task``).
* :mod:`attnlab.lab.training` -- :func:`train_run`, :func:`load_run`.
* :mod:`attnlab.lab.ablation` -- :func:`run_ablation` (resumable, local or Ray);
  :mod:`attnlab.lab.store` -- the SQLite results store.
* :mod:`attnlab.lab.report` -- :func:`write_report`, the self-contained HTML report.
* :mod:`attnlab.lab.demo` -- :func:`run_demo`, the embedded main job.
* :mod:`attnlab.lab.studies` -- studies on trained runs that apply the measures of
  :mod:`attnlab.evaluation` (``attnlab explain``, ``correctness``, ``aer-table``).
"""

from attnlab.lab.task import AttentionExample, Task, TaskData, register_task, spec_label

__all__ = [
    "AttentionExample",
    "Task",
    "TaskData",
    "load_run",
    "register_task",
    "run_ablation",
    "run_demo",
    "spec_label",
    "train_run",
    "write_report",
]

_LAZY = {
    "train_run": "attnlab.lab.training",
    "load_run": "attnlab.lab.training",
    "run_ablation": "attnlab.lab.ablation",
    "write_report": "attnlab.lab.report",
    "run_demo": "attnlab.lab.demo",
}


def __getattr__(name: str):
    """The heavier parts load on first use (``attnlab.lab.train_run`` etc.)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab.lab' has no attribute {name!r}")
