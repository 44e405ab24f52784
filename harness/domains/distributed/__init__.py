"""Claim family *distributed*: real torch.distributed ranks for DDP/FSDP2 mixed precision."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "distributed"
