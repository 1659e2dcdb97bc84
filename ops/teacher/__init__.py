"""The teacher: an OpenAI-compatible chat client with retries, a budget and a persistent response
cache; the local embedded server (transformers serve); prompt templates (Logics-STEM §2, stage 4)."""
