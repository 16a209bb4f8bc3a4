"""Webhooks from the log: endpoints (CLI-managed, secrets sealed), an outbox written in the terminal event's
transaction, Standard Webhooks signing, and a delivery worker that leases outbox rows like runs."""
