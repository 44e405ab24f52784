"""The compiler engine: whether Inductor can compile here (``toolchain``), and compiling a function
under autocast with a configuration variant (``compiling``). The compiled family judges what the
compiler does; the patterns and fp8 families compile through the same door."""
