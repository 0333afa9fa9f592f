"""The job lifecycle: admission, the queue pass, attempts run through a runtime, stops,
owners' controls, recovery after a restart, GPU health and cost; `coordinator.Lifecycle`
composes them.
"""
