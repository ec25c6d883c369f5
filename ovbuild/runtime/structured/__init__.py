"""Structured output: constraints (JSON schema, regex, choice, grammar) compiled with llguidance, and logit bias,
applied to every row where a token is chosen, draft proposals included (docs/serve.md#structured-output)."""
