"""The harness's SLURM launcher (``hydra/launcher=submitit_slurm``,
configs/hydra/launcher/submitit_slurm.yaml).

hydra-submitit-launcher's ``SlurmLauncher`` (same config fields; each job runs as it does
there) with the jobs' results gathered by :func:`harness.sweep.launch_on_slurm`: every job
ends with an outcome the sweep counts, also one that SLURM cancelled, timed out or lost
(hydra-submitit-launcher raises on the first such job and waits forever on a cluster without
accounting), and a refused submission is one line. Importing this module imports neither
submitit nor the harness: Hydra imports every plugin module on every command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


class SlurmLauncher(SubmititSlurmLauncher):
    """Jobs of a sweep as one SLURM job array, through submitit."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from harness.sweep import launch_on_slurm

        return launch_on_slurm(self, job_overrides, initial_job_idx)
