"""Sweeps: one job template run over many cells. `expand` turns `noduslocal map`'s
GNU-parallel-style arguments into tasks; `grid` turns the SDK's grid into cells.
"""
