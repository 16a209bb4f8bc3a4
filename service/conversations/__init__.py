"""Conversations (`/v1/conversations`): streams in the same event log as responses, keyed by `conv_…` ids.

- `protocol.py`: the request bodies (strict pydantic) and ids.
- `fold.py`: the pure fold of a conversation's events into its object and items.
- `store.py`: the transactions (append an event and update the projections together) and reads.
- `service.py`: the operations behind HTTP (validation, 404s, pagination).
"""
