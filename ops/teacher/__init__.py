"""The teacher: an OpenAI-compatible chat client with retries, a budget and a persistent response
cache; the local embedded server (seeded per request); prompt templates (Logics-STEM §2, stage 4)."""
