"""The repository's scripts. Run those that import one another from the repository root as
modules (``python -m scripts.label_gate``), so ``scripts.`` and the packages resolve without
editing ``sys.path``."""
