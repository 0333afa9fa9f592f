"""The daemon's settings: loaded from TOML and flags, checked value by value, taken only
from a file nobody else can change, and followed while the daemon runs.
"""
