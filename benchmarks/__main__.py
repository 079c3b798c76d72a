"""Run every benchmark: ``python -m benchmarks`` (``make bench``)."""

from benchmarks import (
    bench_cohort,
    bench_headline,
    bench_objectives,
    bench_plots,
    bench_service,
    bench_sweep,
    bench_training,
    gpu_trial,
)


def main() -> None:
    bench_objectives.main()
    bench_training.main()
    bench_plots.main()
    bench_cohort.main()
    gpu_trial.main()
    bench_sweep.main([])
    bench_service.main()
    bench_headline.main([])


if __name__ == "__main__":
    main()
