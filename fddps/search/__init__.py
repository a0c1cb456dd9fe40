"""Searches over parallelization strategies (above :mod:`fddps.strategy`, which never imports them).

- :mod:`.tofu`: Tofu's recursive partitioning (EuroSys 2019, Section 5).
"""
