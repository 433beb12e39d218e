"""Acceptance length: measured in vLLM, and estimated offline from the draft itself."""
