"""What the daemon, the SDK and the CLI share, on the standard library alone: phases and
their transitions, error codes, units and times, the job and sweep specs (gangs, indexes,
GPU requests) and the validation of what users send.
"""
