"""`ovbuild serve`: an OpenAI-compatible HTTP server on the continuous-batching runtime (needs ovbuild[serve])."""
