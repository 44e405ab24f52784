"""Layer 2: what the machine is and which kernels run on it: CPU and GPU detection, the kernel set that
``ONEDNN_MAX_CPU_ISA`` and ``ATEN_CPU_CAPABILITY`` leave, hardware classes, published peaks,
kernel availability probes and host load. Below the claim-family domains (they ask it which
kernels exist), above the numerics; no pytest, no files of the harness's own."""
