"""Runtimes: the interface every runtime implements (base.py) with what an attempt directory
says, and one subpackage per runtime (host processes, docker).
"""
