"""The box's GPUs: the model of an inventory, read from NVML or simulated, Xid events, and
what a job's GPUs cost while it holds them.
"""
