"""noduslocald: the API on the Unix socket, the job and sweep lifecycles, the scheduler, the
GPUs, the files and disks, the store and the runtimes, composed in `build.build_daemon`.
"""
