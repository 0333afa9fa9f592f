"""The HTTP API on the Unix socket: one module per resource that parses, authorises and
serialises, and calls the services; never the store, a runtime or the scheduler.
"""
