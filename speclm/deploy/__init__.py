"""`speclm deploy`: the draft model, the target model and an OpenAI-compatible coordinator as separate Ray
Serve deployments (needs the optional extra: pip install 'speclm[deploy]'); see docs/deploy.md."""
