"""The Python SDK (`import noduslocal as nodus`): Job, Sweep, Client and View over the
daemon's HTTP API, and the lean wire client the CLI shares.
"""
