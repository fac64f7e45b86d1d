"""The domain: aggregates, their events and rules; no I/O (the application service that loads and
saves them is handlers/application.py).

This package's own module loads nothing: `bb` imports `domain.status` for every command, and the
event library (domain/topics.py, the aggregates) is for the service's side only."""
