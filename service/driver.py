"""``python -m service.driver SWEEP_ID``: the entry point launchers, compose and Ray Jobs name.

The driver lives in :mod:`service.orchestrator.sweep_process`; this module only keeps the command.
"""

import sys

from workers.imports import heavy_imports

with heavy_imports():  # Ray, Tune and MLflow
    from service.orchestrator.sweep_process import main

if __name__ == "__main__":
    sys.exit(main())
