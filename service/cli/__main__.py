"""``python -m service.cli``: the ``ksweep`` command."""

from service.cli import main

main()
