"""Run every benchmark: ``python -m benchmarks`` (``make bench``)."""

import subprocess
import sys

from benchmarks import (
    bench_checkpoints,
    bench_cohort,
    bench_compiled,
    bench_dataset_training,
    bench_datasets,
    bench_headline,
    bench_import,
    bench_interpreter,
    bench_member_overhead,
    bench_objectives,
    bench_plots,
    bench_readouts,
    bench_service,
    bench_shared_ray,
    bench_sweep,
    bench_text_cohort,
    bench_training,
    bench_trial_path,
    bench_writer_process,
    cohort_profile,
    gpu_trial,
    sweep_timeline,
)


def main() -> None:
    bench_objectives.main()
    bench_training.main()
    bench_plots.main()
    bench_cohort.main()
    bench_compiled.main()
    bench_readouts.main([])
    cohort_profile.main(out=None)  # the committed raw output: python -m benchmarks.cohort_profile
    bench_trial_path.main(repeats=3)  # a trial of one against a stacked cohort of one, one process
    bench_datasets.main([])
    bench_dataset_training.main([])
    bench_text_cohort.main([])  # a real-text member's epoch against its floor (minutes)
    gpu_trial.main()
    bench_sweep.main([])
    bench_member_overhead.main()  # N = 16 and 64: the per-member slope and the fixed cost
    sweep_timeline.main()  # where that fixed cost goes
    bench_writer_process.main()  # a cohort's writer process against its trial process
    bench_shared_ray.main()  # a sweep's own local Ray against one it connects to
    bench_interpreter.main()  # the same sweep under each CPython 3.11 build here
    bench_checkpoints.main([])
    bench_service.main()
    bench_import.main()  # the API's import and ksweep --help
    # locust monkey-patches the standard library with gevent: its benchmark runs in a child.
    subprocess.run([sys.executable, "-m", "benchmarks.bench_load", "--duration", "8"], check=True)
    bench_headline.main([])


if __name__ == "__main__":
    main()
