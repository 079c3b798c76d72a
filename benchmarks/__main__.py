"""Run every benchmark: ``python -m benchmarks`` (``make bench``)."""

from benchmarks import bench_objectives


def main() -> None:
    bench_objectives.main()


if __name__ == "__main__":
    main()
