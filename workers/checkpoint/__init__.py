"""The checkpoint store: one format, a local and an S3 backend, reads, and how often to save."""
