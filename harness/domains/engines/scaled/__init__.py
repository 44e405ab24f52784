"""Scaled products, shared by the fp8 and the block-scaled families: a low-precision product's
error budget and SQNR floor from its operands' formats and scales (``matmul``), its script against
float64 (``products``), the first linear of a failed training run whose products leave their
budget (``localise``), and the training band's rule for scaled formats (``band``).
"""
