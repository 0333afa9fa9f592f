"""The host-process runtime: a shim per rank that outlives the daemon, the spawner that
forks shims, and `job exec` beside a host job.
"""
