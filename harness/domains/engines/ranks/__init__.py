"""Process groups on one host: a world of ranks, its collectives observed, and what a wrapper's
declared mixed-precision policy is compared with. The distributed family's checks, FSDP2's
float8 all-gather and the interconnect's speed run on it."""
