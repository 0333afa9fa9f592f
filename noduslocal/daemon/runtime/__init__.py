"""Runtimes: the interface every runtime implements and the neutral types it speaks in
(base.py); the per-attempt shim (shim.py, shim.c, compiled_shim.py) and the reader of the
attempt directory it writes (attempt_dir.py), shared by the runtimes that run a shim; and one
subpackage per runtime (host processes, docker), which never import each other.
"""
