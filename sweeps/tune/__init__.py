"""The Ray Tune driver: the runner, the trainables (lone and cohort), the search space, progress."""
