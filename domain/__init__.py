"""The domain: aggregates, their events and rules, the application service; no I/O.

This package's own module loads nothing: `bb` imports `domain.status` for every command, and the
event library (domain/topics.py, the aggregates) is for the service's side only."""
