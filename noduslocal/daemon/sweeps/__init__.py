"""Sweeps: admission of every cell, the controller (canary, release up to max_parallel,
the end), owners' controls, reports, estimates and webhooks.
"""
