"""cugru: a GRU training operator (forward and backward with saved history) on CuPy.

Empty for now: the operator is built on cukernels' runtime in a later release.
"""
__all__: list[str] = []
