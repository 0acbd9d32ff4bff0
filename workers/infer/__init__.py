"""Batch inference: prompts in, outputs out, resumable by request, and the fast decode paths."""
