"""Studies on trained runs: the drivers that load finished runs (or ablations) of the lab
and apply the pure measures of :mod:`attnlab.evaluation` to them.

* :mod:`.alignment` -- the translator's attention as word alignment: AER tables per
  mechanism over seeds (``attnlab aer-table``).
* :mod:`.explanation` -- the attention-as-explanation tests of Jain & Wallace (2019) and
  Wiegreffe & Pinter (2019) on a sentence classifier's run (``attnlab explain``).
* :mod:`.vqa_correctness` -- attention correctness of an easy-VQA run
  (``attnlab correctness``).

Each module is imported only when its command runs (``attnlab.cli.LAZY_COMMANDS``).
"""
