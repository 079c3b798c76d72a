"""``python -m ksweep.cli``: the ``ksweep`` command."""

from ksweep.cli import main

main()
