"""What a job has on disk: its directory, kept workspace and attempt directories, the blob
store, collected outputs and snapshots, read for its owner without following links.
"""
