"""Registered datasets: file formats, reading, validation, the store, and the trainer's tensors.

Torch-free except :mod:`.source` and :mod:`.cache` (the trainer's arrays); pyarrow loads with
the modules that read tables, so the API process registers and lists without it.
"""
