"""The built-in model as shipped: a compact float16 artifact and its manifest (see the README's model card)."""
