"""The docker runtime: a container per rank made through dockerd, its logs pumped into the
attempt directory, its end learnt from dockerd's events, and a gang's own network.
"""
