"""The plan of a sweep: its rows and trials (``build``) and when two trials are one (``equivalence``)."""
