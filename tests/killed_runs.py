"""A run killed right after it wrote round k: shared by the resume, hostile-file and durability
tests (the runner's progress write raises, as if the process had been killed there)."""
from pathlib import Path

import pytest

from fedjax_dp.experiments import runner


class Killed(Exception):
    """Stands in for the process being killed."""


def kill_after(config: dict, folder: Path, rounds: int) -> Path:
    """Run ``config`` into ``folder`` and stop it right after round ``rounds`` is written to
    progress.jsonl (its checkpoints up to then are kept); returns ``folder``."""
    real = runner.append_progress

    def append(out, record):
        real(out, record)
        if record["round"] == rounds:
            raise Killed

    runner.append_progress = append
    try:
        with pytest.raises(Killed):
            runner.run(config, folder)
    finally:
        runner.append_progress = real
    return folder
