"""The scheduler, pure logic: queue order and admission, capacity, GPU sets, fair share
and estimates of when a job starts.
"""
