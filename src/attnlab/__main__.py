"""``python -m attnlab``: the ``attnlab`` command (:mod:`attnlab.cli`)."""

from attnlab.cli import main

if __name__ == "__main__":
    main(prog_name="attnlab")
