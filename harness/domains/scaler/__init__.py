"""Claim family *loss scaling*: reference semantics of dynamic loss scalers (torch, Megatron,
DeepSpeed, Apex), adapters, the known-issues registry, and the conformance state machine."""
