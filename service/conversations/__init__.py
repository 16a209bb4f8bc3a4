"""Conversations (`/v1/conversations`): streams in the same event log as responses, keyed by `conv_…` ids.

- `protocol.py`: the request bodies (strict pydantic) and ids.
- `service.py`: the operations behind HTTP (validation, 404s, pagination).

Their tables are the store's, like the responses': `service/store/conversations.py` (the transactions: append
an event and update the projections together; reads) and `service/store/conversation_fold.py` (the pure fold
of a conversation's events into its object and items). The store needs them itself (a response's items join
its conversation in the terminal transaction; rebuild, doctor and retention), so they live below this
package, and the dependency goes one way: conversations -> store.
"""
