"""Test doubles: a scripted OpenAI-compatible server and gateway helpers (tests and benchmarks)."""
