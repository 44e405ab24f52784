"""Layer 1, the bottom: pure numerics and comparison.

Float formats at the bit level, tolerances with their origins, error budgets, comparisons that
return typed results, and the outcome of a check. No pytest, no files, no paths: everything here
is a function of its arguments. torch is imported only where tensors are computed on.
"""
