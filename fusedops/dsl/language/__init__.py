"""The kernel language: dtypes, promotion rules, typed IR construction (semantics) and builtins."""
