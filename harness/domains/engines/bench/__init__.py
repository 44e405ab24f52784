"""The timing bench: AMP and its baseline timed interleaved, sized to the device's ladder rung.

The speed family judges its cases with it; compiled and fp8 time their own workloads on it.
"""
