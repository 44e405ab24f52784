"""Claim family *distributed*: real torch.distributed ranks for DDP/FSDP2 mixed precision."""
