"""Constrained decoding with llguidance: schemas and grammars compiled (cached, checked), per-run
matchers rebuilt from logged tokens, and the plan of what a request allows the model to write."""
