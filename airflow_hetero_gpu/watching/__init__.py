"""Watching a running training: its lease, its GPU set, its checkpoints, and the looks that decide
what its watcher does — the same code whether a worker watches it (the operator's run loop) or
the triggerer does (a deferred run phase)."""
