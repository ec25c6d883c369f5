"""Turning logits into tokens: sampling, verification of drafts, penalties, logprobs and the detokenizer."""
