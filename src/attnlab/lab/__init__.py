"""The lab: tasks on real data, training, ablation studies, results and reports.

* :mod:`attnlab.lab.task` -- the :class:`Task` contract and :func:`spec_label`.
* :mod:`attnlab.lab.tasks` -- the registered tasks (``attnlab list --kind task``).
"""

from attnlab.lab.task import AttentionExample, Task, TaskData, register_task, spec_label

__all__ = ["AttentionExample", "Task", "TaskData", "register_task", "spec_label"]
