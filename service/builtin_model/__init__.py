"""The built-in model as shipped: a compact float16 artifact and its manifest (see docs/models.md, the model card)."""
