"""The host-process runtime: a shim per rank (runtime/shim.py) that outlives the daemon, the
spawner that forks shims on this box, and `job exec` beside a host job.
"""
