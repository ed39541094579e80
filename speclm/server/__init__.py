"""The OpenAI-compatible HTTP server: schemas, app, metrics."""
