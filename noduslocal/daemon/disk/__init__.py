"""The data dir's disk: each user's use against their quota, the reserve new work needs, the
watch that stops a job filling the disk, and retention (reclaim) of ended jobs.
"""
