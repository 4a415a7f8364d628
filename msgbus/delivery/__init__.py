"""Pushing messages to subscribers: signing, the HTTP sender, retry policy and the trace writer.

Shared by the dispatcher and the compensator so both push the same way.
"""
