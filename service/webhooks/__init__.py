"""Webhooks from the log: endpoints (CLI-managed, secrets sealed), an outbox the store writes in the terminal event's
transaction (service/store/webhook_outbox.py), Standard Webhooks signing,
and a delivery worker that leases outbox rows like runs."""
