"""The job lifecycle: admission, the queue pass, attempts run through a runtime, stops,
owners' and admins' controls, gang and indexed runs, GPU health and cost.
"""
